"""`--region NAME` on every command (dsl/region_names.py): a region's own name or an instance's
display name (`proj<q4_0>`), resolved from the region IR and from a build folder's manifest
alike; an unknown name is a diagnostic naming the names near it (tests/data/generic.fuse)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.region_names import resolve_regions
from tests.conftest import fusec_cli

SOURCE = Path(__file__).parents[1] / "data" / "generic.fuse"
# what each spelling names in generic.fuse: the naming rule's instance `mva_q4_0` answers for
# `mva<q4_0>`, not `mva_long` (an instance line of the same dtypes)
NAMES = {
    "proj": "proj",
    "proj<f16>": "proj",
    "proj<q4_0>": "proj_q4_0",
    "proj_q4_0": "proj_q4_0",
    "proj<q8_0> on sm90": "proj_q8_0__sm90",
    "proj<f16> on sm90": "proj__sm90",
    "mva<q4_0>": "mva_q4_0",
    "mva_long": "mva_long",
}


@pytest.fixture(scope="module")
def program() -> Any:
    from fusec.codegen import build

    return build.check_source(SOURCE.read_text(), str(SOURCE))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fusec.codegen import build

    made = build.build_source(
        SOURCE.read_text(), str(SOURCE), regions=("proj", "proj<q4_0>"), variants=True
    )
    return build.write_build(made, tmp_path_factory.mktemp("names") / "build")


def _error(regions: Any, name: str) -> tuple[str, str]:
    with pytest.raises(DiagnosticError) as exc:
        resolve_regions(regions, ("proj", name), "g.fuse")
    (d,) = exc.value.diagnostics
    assert d.span is None and d.hint is not None
    return d.message, d.hint


def test_names_and_display_names_resolve_in_order(program: Any) -> None:
    got = resolve_regions(program.regions, tuple(NAMES), "g.fuse")
    assert got == tuple(NAMES.values())
    assert resolve_regions(program.regions, (), "g.fuse") == ()


def test_an_unknown_name_lists_the_names_near_it(program: Any) -> None:
    message, hint = _error(program.regions, "proj<q4_K>")
    assert message == "no region 'proj<q4_K>' in g.fuse"
    assert hint.startswith("did you mean ") and "proj<q4_0>" in hint
    assert "mva" not in hint  # only the near ones
    message, hint = _error(program.regions, "mav_lnog")
    assert "mva_long" in hint.split("did you mean ")[1]
    # nothing near: every region, by name
    message, hint = _error(program.regions, "zzzz")
    assert message == "no region 'zzzz' in g.fuse"
    assert hint == "regions: " + ", ".join(r.name for r in program.regions)


@pytest.mark.shaderc
def test_a_build_folders_manifest_resolves_alike(program: Any, folder: Path) -> None:
    from fusec.codegen import manifest_records as mr

    m = mr.Manifest.from_json(json.loads((folder / "manifest.json").read_text()))
    # a named region brings its target variants: what runs on sm90 (`schedule on sm90` lines)
    assert [r.name for r in m.regions] == ["proj", "proj__sm90", "proj_q4_0", "proj_q4_0__sm90"]
    assert resolve_regions(m.regions, ("proj<q4_0>", "proj<f16>"), "b") == ("proj_q4_0", "proj")
    _, hint = _error(m.regions, "proj<q8_0>")
    assert "proj<q4_0>" in hint  # the manifest's own regions, by display name
    # the manifest and the program find the same instance (dsl.instances.find_instance)
    for dtypes in ({"W": "q4_0"}, {"W": "f16"}):
        by_manifest, by_program = m.instance("proj", dtypes), program.instance("proj", dtypes)
        assert by_manifest is not None and by_program is not None
        assert by_manifest.name == by_program.name
    assert m.instance("proj", {"W": "q8_0"}) is None  # not built into this folder
    assert program.instance("proj", {"W": "q8_0"}).name == "proj_q8_0"  # type: ignore[union-attr]


def _occupancy(*args: str) -> Any:
    proc = fusec_cli(["occupancy", *args, "--json"], capture_output=True, text=True)
    assert "Traceback" not in proc.stderr
    return proc.returncode, (json.loads(proc.stdout) if proc.returncode == 0 else proc.stderr)


@pytest.mark.shaderc
def test_occupancy_takes_a_display_name(folder: Path) -> None:
    # a .fuse file: only the instance named is built, and its rows come back
    rc, rows = _occupancy(str(SOURCE), "--region", "mva<q4_0>", "--target", "gfx1201")
    assert rc == 0 and rows and {r["region"] for r in rows} == {"mva_q4_0"}
    assert {r["target"] for r in rows} == {"gfx1201"}
    # a build folder of more regions: the rows of the region named and of its target variant
    # (what runs on sm90), on that target only
    rc, rows = _occupancy(str(folder), "--region", "proj<q4_0>")
    assert rc == 0 and rows and {r["region"] for r in rows} == {"proj_q4_0", "proj_q4_0__sm90"}
    assert {r["target"] for r in rows if r["region"] == "proj_q4_0__sm90"} == {"sm90"}
    rc, rows = _occupancy(str(folder), "--region", "proj<q4_0>", "--target", "gfx1201")
    assert rc == 0 and rows and {r["region"] for r in rows} == {"proj_q4_0"}
    rc, every = _occupancy(str(folder))
    assert rc == 0
    assert {r["region"] for r in every} == {"proj", "proj__sm90", "proj_q4_0", "proj_q4_0__sm90"}
    # unknown, in a folder and in a file: the near names
    for where in (str(folder), str(SOURCE)):
        rc, err = _occupancy(where, "--region", "proj<q4_K>")
        assert rc == 1 and f"fusec: error: no region 'proj<q4_K>' in {where}" in err
        assert "hint: did you mean proj<q4_0>" in err


@pytest.mark.shaderc
def test_explain_takes_a_display_name() -> None:
    proc = fusec_cli(
        ["explain", str(SOURCE), "--region", "proj<q8_0>", "--width", "200"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "region proj_q8_0 (" in proc.stdout and "instance proj<q8_0>" in proc.stdout
    # on a target with a variant, the variant is what runs there: it is explained, and said so
    proc = fusec_cli(
        ["explain", str(SOURCE), "--region", "proj<q8_0>", "--target", "sm90", "--width", "200"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("on sm90, proj<q8_0> runs as its variant proj_q8_0__sm90 ")
    assert lines[1].startswith("region proj_q8_0__sm90 (") and "proj<q8_0> on sm90" in lines[1]
    proc = fusec_cli(
        ["explain", str(SOURCE), "--region", "proj<q9_0>"], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "no region 'proj<q9_0>'" in proc.stderr and "did you mean" in proc.stderr


def test_tune_resolves_through_the_same_names() -> None:
    from fusec.runtime.tune import resolve

    text = SOURCE.read_text()
    assert resolve(text, "g.fuse", "proj<q4_0>").name == "proj_q4_0"
    assert resolve(text, "g.fuse", "mva_long").name == "mva_long"
    # a target variant is tuned through its instance: not a name of its own here
    with pytest.raises(DiagnosticError) as exc:
        resolve(text, "g.fuse", "proj<q4_0> on sm90")
    (d,) = exc.value.diagnostics
    assert d.message == "no region 'proj<q4_0> on sm90' in g.fuse"
    assert d.hint is not None and "proj<q4_0>" in d.hint


@pytest.mark.shaderc
def test_check_of_a_folder_names_the_folder(folder: Path) -> None:
    """`fusec check DIR --region R` with a name of no region says it is not in the folder that
    was given (it named the source file the folder was built from; a new-user probe)."""
    proc = fusec_cli(
        ["check", str(folder), "--region", "proj<q4_K>"], capture_output=True, text=True
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(
        f"fusec: error: no region 'proj<q4_K>' in build folder {folder}\n"
    )
    assert "hint: did you mean proj<q4_0>" in proc.stderr
