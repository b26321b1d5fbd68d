"""A manifest of an unknown format, with a value of the wrong type or without a key the format
requires is refused in one sentence, by `Build.load` and by `fusec check DIR` (exit 1), before
any device is opened (runtime/prebuilt.py).  The damage is drawn afresh on every run, and the
manifest is resealed, so only the format and the schema can refuse it."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from fusec.codegen import manifest as mf
from fusec.runtime import cli
from fusec.runtime.device import RuntimeFailure
from fusec.runtime.dispatch import Build
from tests.conftest import fusec_cli

pytestmark = pytest.mark.shaderc

# keys the format may leave out: removing one leaves a valid manifest
OPTIONAL = {"build_key", "glsl_sha256", "build_options", "state", "values", "tolerance"}
OPTIONAL |= {"uncertain", "fused_shared"}
# an estimate without `loads_up` reads as one whose scheduler moves nothing (manifest_kernel.py)
OPTIONAL |= {"loads_up"}
# a region that is no instance, an input kept in GGUF blocks, a kernel without counters
OPTIONAL |= {"instance", "packing", "counters"}
# objects that are maps (an instance's type bindings), not records with required keys
MAPS = {"verdicts", "bindings"}


def _places(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], Any]]:
    """Every (path, value) of a JSON tree below the root."""
    out = []
    items = node.items() if isinstance(node, dict) else enumerate(node)
    for k, v in items:
        out.append(((*path, k), v))
        if isinstance(v, dict | list):
            out += _places(v, (*path, k))
    return out


def _json_path(path: tuple[Any, ...]) -> str:
    """`regions`, 0, `line` as the validator names it: `.regions[0].line` (a wave key of the
    verdicts: `['32']`)."""
    return "".join(
        f"[{p}]" if isinstance(p, int) else f".{p}" if p.isidentifier() else f"['{p}']"
        for p in path
    )


def _at(data: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        data = data[p]
    return data


def _wrong_type(data: dict[str, Any], rng: random.Random) -> str:
    """A scalar somewhere in the manifest replaced by a value of a type its field never takes;
    the path the refusal must name (or lie under)."""
    scalars = [
        (p, v)
        for p, v in _places(data)
        if not isinstance(v, dict | list)
        and p[0] not in ("format", "integrity")
        and "verdicts" not in p[:-1]  # a target's verdicts are keyed by wave
    ]
    path, value = rng.choice(scalars)
    if isinstance(value, bool):
        new: Any = rng.choice(["yes", None])
    elif isinstance(value, int | float):
        new = rng.choice(["7", [7], {"n": 7}])
    elif value is None:
        new = rng.choice([[7], {"n": 7}, True])
    else:
        new = rng.choice([7, True, [value], {"name": value}])
    _at(data, path[:-1])[path[-1]] = new
    return _json_path(path)


def _missing_key(data: dict[str, Any], rng: random.Random) -> str:
    """A key the format requires removed from an object of the manifest."""
    objects = [(p, v) for p, v in _places(data) if isinstance(v, dict) and p[-1] not in MAPS]
    objects = [(p, v) for p, v in objects if len(p) < 2 or p[-2] != "verdicts"]
    objects.append(((), data))
    kept = OPTIONAL | {"integrity", "format"}  # a missing format is the format's refusal
    choices = [(p, k) for p, v in objects for k in v if k not in kept]
    path, key = rng.choice(choices)
    del _at(data, path)[key]
    return _json_path(path)


def _damage(base: Path, dest: Path, kind: str, rng: random.Random) -> tuple[str, str]:
    """A resealed copy of the build with one kind of damage; (what the refusal must say, the
    JSON path it names, '' for the format)."""
    shutil.copytree(base, dest)
    data = json.loads((dest / "manifest.json").read_text())
    if kind == "format":
        fmt = rng.choice([f"fusec-manifest/{rng.choice([1, 3, 4, 17])}", "fusec-manifest", "x"])
        data["format"] = fmt
        want, path = f"is not a {mf.FORMAT} manifest (it says '{fmt}')", ""
    elif kind == "type":
        path = _wrong_type(data, rng)
        want = "is invalid: "
    else:
        path = _missing_key(data, rng)
        want = "is invalid: "
    (dest / "manifest.json").write_text(json.dumps(mf.seal(data), indent=1))
    return want, path


def _assert_one_sentence(message: str, want: str, path: str) -> None:
    assert "\n" not in message and want in message, message
    if path:
        named = message.split("field ", 1)[1].split(" is invalid", 1)[0]
        assert path.startswith(named), (named, path)


KINDS = ["format", "type", "missing"]


@pytest.mark.parametrize("kind", KINDS)
def test_build_load_refuses_in_one_sentence(
    kernels_folder: Path, tmp_path: Path, kind: str
) -> None:
    seed = random.randrange(2**32)
    for i in range(3):  # a fresh damage each run; each load validates the whole manifest (~3 s)
        want, path = _damage(kernels_folder, tmp_path / str(i), kind, random.Random(seed + i))
        with pytest.raises(RuntimeFailure) as info:
            Build.load(tmp_path / str(i))
        [diag] = info.value.diagnostics
        _assert_one_sentence(diag.message, want, path)
        assert diag.hint == "rebuild it with fusec build FILE -o DIR", (seed, diag)


@pytest.mark.parametrize("kind", KINDS)
def test_check_refuses_before_opening_a_device(
    kernels_folder: Path,
    tmp_path: Path,
    kind: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`fusec check DIR` in this process, with a Device that fails the test if it is opened."""

    def no_device(*args: object, **kwargs: object) -> None:
        raise AssertionError("a device was opened for a damaged folder")

    monkeypatch.setattr(cli, "Device", no_device)
    seed = random.randrange(2**32)
    want, path = _damage(kernels_folder, tmp_path / "b", kind, random.Random(seed))
    assert cli.main(["check", str(tmp_path / "b")]) == 1, seed
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[1] == "  hint: rebuild it with fusec build FILE -o DIR", lines
    assert lines[0].startswith("fusec: error: ") and str(tmp_path / "b") in lines[0], lines
    _assert_one_sentence(lines[0], want, path)


@pytest.mark.parametrize("kind", KINDS)
def test_the_fusec_command_exits_1(kernels_folder: Path, tmp_path: Path, kind: str) -> None:
    want, path = _damage(kernels_folder, tmp_path / "b", kind, random.Random())
    proc = fusec_cli(["check", str(tmp_path / "b")], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("fusec: error: "), proc.stderr
    _assert_one_sentence(lines[0], want, path)
    assert proc.stdout == ""


def _counting_schema(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = mf.schema_error

    def counted(data: Any) -> str | None:
        calls.append(1)
        return original(data)

    monkeypatch.setattr(mf, "schema_error", counted)
    return calls


def test_content_that_passed_the_schema_is_not_checked_again(
    kernels_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schema check (nine tenths of a load) runs once per content, schema and validator:
    a second load of the same bytes skips it and gives the same records; damage drawn afresh
    (a new digest) is checked and refused although the intact manifest passed; another
    validator (its key) checks again."""
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    calls = _counting_schema(monkeypatch)
    first = Build.load(kernels_folder).manifest
    second = Build.load(kernels_folder).manifest
    assert first == second and len(calls) == 1
    assert len(list((tmp_path / "cache" / "validated").iterdir())) == 1
    kind = random.choice(["type", "missing"])
    want, path = _damage(kernels_folder, tmp_path / "b", kind, random.Random())
    for _ in range(2):  # a refusal is never remembered
        with pytest.raises(RuntimeFailure) as info:
            Build.load(tmp_path / "b")
        _assert_one_sentence(info.value.diagnostics[0].message, want, path)
    assert len(calls) == 3
    monkeypatch.setattr(mf, "_validator_key", lambda: "another-validator")
    assert Build.load(kernels_folder).manifest == first and len(calls) == 4


def test_an_unusable_cache_folder_still_checks_every_load(
    kernels_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "not-a-folder").write_text("x")
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "not-a-folder"))
    calls = _counting_schema(monkeypatch)
    for n in (1, 2):
        Build.load(kernels_folder)
        assert len(calls) == n
    want, path = _damage(kernels_folder, tmp_path / "b", "type", random.Random())
    with pytest.raises(RuntimeFailure) as info:
        Build.load(tmp_path / "b")
    _assert_one_sentence(info.value.diagnostics[0].message, want, path)


def test_the_memo_keeps_a_bounded_number_of_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(mf, "SCHEMA_MEMO_ENTRIES", 3)
    for i in range(5):
        memo = mf._SchemaMemo.of(mf.seal({"format": mf.FORMAT, "n": i}))
        assert memo is not None and not memo.passed()
        memo.remember()
        assert memo.passed()
    assert len(list((tmp_path / "validated").iterdir())) == 3
    assert mf._SchemaMemo.of({"format": mf.FORMAT, "integrity": "sha256:00"}) is None  # unsealed


def test_an_integer_constant_written_as_a_real_is_refused(
    kernels_folder: Path, tmp_path: Path
) -> None:
    """`1000.0` for a u32 constant's default, least or largest value, resealed: fusec writes
    integers there, and a real would reach the run as one (`N=1000.0`); refused in one
    sentence naming the constant and the field (the default that is a whole number included)."""
    rng = random.Random(random.randrange(2**32))
    for i in range(3):
        dest = tmp_path / str(i)
        shutil.copytree(kernels_folder, dest)
        data = json.loads((dest / "manifest.json").read_text())
        places = [
            (c, key)
            for r in data["regions"]
            for c in r["consts"]
            if c["dtype"] in ("u32", "i32")
            for key in ("default", "min", "max")
            if c[key] is not None
        ]
        const, key = rng.choice(places)
        const[key] = float(const[key])
        (dest / "manifest.json").write_text(json.dumps(mf.seal(data), indent=1))
        with pytest.raises(RuntimeFailure) as info:
            Build.load(dest)
        [diag] = info.value.diagnostics
        what = {"default": "default", "min": "least value", "max": "largest value"}[key]
        assert diag.message.endswith(
            f"constant '{const['name']}' is {const['dtype']} but its {what} is {const[key]!r}"
        ), diag.message
