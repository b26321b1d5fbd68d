"""A rebuild with nothing changed is skipped (issue 20): `fusec build FILE -o DIR` leaves an
intact build of the same source, targets, compiler and fusec untouched and says so; any change
to the source, the targets or a file of the folder builds again.  The grammar's parser tables are
cached in fusec's private cache folder and never trusted from a folder others may write."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from fusec.dsl.cachedir import private_folder
from fusec.runtime.cli import main
from tests.conftest import ROOT

pytestmark = pytest.mark.shaderc

SOURCE = (ROOT / "tests" / "data" / "scale.fuse").read_text()


def _count_compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The kernel names the compiler is called for from now on (it still compiles)."""
    import fusec.codegen.build as build

    calls: list[str] = []
    real = build.compile_glsl

    def counting(*args: object, **kwargs: object) -> bytes:
        calls.append(str(args[1]))
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(build, "compile_glsl", counting)
    return calls


def _body(glsl: str) -> str:
    """GLSL without what only reaches debug information (the kernel's name, `#line`s)."""
    return "\n".join(
        line for line in glsl.splitlines() if not line.startswith(("#line ", "// kernel "))
    )


def _snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _build(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    rc = main(["build", *args])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


@pytest.fixture
def built(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path]:
    src = tmp_path / "r.fuse"
    src.write_text(SOURCE)
    out = tmp_path / "out"
    assert "built 1 region(s)" in _build([str(src), "-o", str(out)], capsys)
    return src, out


def test_a_rebuild_with_nothing_changed_touches_nothing(
    built: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = built
    before = _snapshot(out)
    said = _build([str(src), "-o", str(out)], capsys)
    assert "is up to date (1 region(s), 2 kernel(s)" in said
    assert _snapshot(out) == before
    # --force compiles again and writes the same SPIR-V
    assert "built 1 region(s)" in _build([str(src), "-o", str(out), "--force"], capsys)
    after = _snapshot(out)
    assert {k: v[0] for k, v in after.items()} == {k: v[0] for k, v in before.items()}


def test_a_changed_source_or_target_list_builds_again(
    built: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    src, out = built
    assert "built" in _build([str(src), "-o", str(out), "--target", "gfx1201"], capsys)
    assert "up to date" in _build([str(src), "-o", str(out), "--target", "gfx1201"], capsys)
    src.write_text(SOURCE.replace("1000", "1001"))
    assert "built" in _build([str(src), "-o", str(out), "--target", "gfx1201"], capsys)
    assert "N = 1001" in (out / "source.fuse").read_text()


def test_any_damaged_file_of_the_folder_builds_again(
    built: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every file of the folder, damaged in a random way (a byte flipped, cut short, emptied,
    removed), makes the next build compile, and the rebuilt folder equals the original."""
    src, out = built
    pristine = {k: v[0] for k, v in _snapshot(out).items()}
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    for name in sorted(pristine):
        how = rng.choice(["flip", "truncate", "empty", "remove"])
        path = out / name
        data = path.read_bytes()
        if how == "flip":
            i = rng.randrange(len(data))
            path.write_bytes(data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :])
        elif how == "truncate":
            path.write_bytes(data[: rng.randrange(len(data))])
        elif how == "empty":
            path.write_bytes(b"")
        else:
            path.unlink()
        rc = main(["build", str(src), "-o", str(out)])
        said, err = capsys.readouterr()
        if name == "manifest.json" and how in ("empty", "remove", "truncate", "flip"):
            # without a readable fusec manifest the folder may no longer be ours: either refused
            # (nothing touched) or rebuilt; never "up to date"
            assert "up to date" not in said
            if rc != 0:
                assert "does not replace it" in err
                path.write_bytes(data)
                continue
        else:
            assert rc == 0, (name, how, err)
            assert "built 1 region(s)" in said, (name, how, said)
        assert {k: v[0] for k, v in _snapshot(out).items()} == pristine, (name, how)


def test_the_grammar_tables_are_cached_and_a_bad_cache_is_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    cache = tmp_path / "cache"
    env = {**os.environ, "FUSEC_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT)}
    src = tmp_path / "r.fuse"
    src.write_text(SOURCE)
    probe = [
        sys.executable,
        "-c",
        "import sys; from fusec.dsl.parse import parse; "
        "print(parse(open(sys.argv[1]).read(), sys.argv[1]).regions[0].name)",
        str(src),
    ]

    def parses() -> None:
        proc = subprocess.run(probe, env=env, capture_output=True, text=True, check=False)
        assert proc.returncode == 0 and proc.stdout.strip() == "scale", proc.stderr
        assert proc.stderr == ""

    parses()
    tables = list((cache / "grammar").iterdir())
    assert len(tables) == 1 and tables[0].stat().st_size > 1000
    assert (cache / "grammar").stat().st_mode & 0o777 == 0o700
    parses()  # loaded from the tables
    tables[0].write_bytes(b"garbage\n" + os.urandom(64))
    parses()  # a damaged file is rebuilt, not trusted
    assert tables[0].read_bytes()[:7] != b"garbage"
    os.chmod(cache / "grammar", 0o777)  # others could plant a pickle: not used at all
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(cache))
    with pytest.raises(OSError, match="written by other users"):
        private_folder("grammar")
    tables[0].write_bytes(b"garbage")
    parses()
    assert tables[0].read_bytes() == b"garbage"


def test_a_fresh_folder_reuses_compiled_kernels_from_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object cache (codegen/objcache.py `ObjectCache`): a second build of the same source
    into a new folder compiles nothing and writes the same bytes and estimates; an entry that
    no longer reads back as SPIR-V is compiled again; an unusable cache folder is no cache."""
    import sqlite3

    import fusec.codegen.build as build
    import fusec.codegen.objcache as objcache

    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    n = random.randrange(200, 5000)
    text = SOURCE.replace("N = 1000", f"N = {n}")  # a source no other test built
    first = build.build_source(text, "r.fuse")

    def no_compiler(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("compiled although the kernel is in the cache")

    monkeypatch.setattr(build, "compile_glsl", no_compiler)
    again = build.build_source(text, "r.fuse")
    assert [b.spv for b in again.kernels] == [b.spv for b in first.kernels]
    assert again.manifest == first.manifest
    monkeypatch.undo()
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))

    db = sqlite3.connect(tmp_path / "cache" / "objects" / "objects.sqlite")
    with db:
        db.execute(f"UPDATE {objcache.OBJECTS_TABLE} SET spv = ?", (b"\0" * 64,))
    db.close()
    calls = _count_compiles(monkeypatch)
    damaged = build.build_source(text, "r.fuse")
    assert calls and len(calls) == len({_body(b.glsl) for b in first.kernels})
    assert [b.spv for b in damaged.kernels] == [b.spv for b in first.kernels]

    (tmp_path / "not_a_folder").write_text("x")
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "not_a_folder"))
    calls.clear()
    assert [b.spv for b in build.build_source(text, "r.fuse").kernels] == [
        b.spv for b in first.kernels
    ]
    assert len(calls) == len({_body(b.glsl) for b in first.kernels})


MATVEC = """
region mv(x: f32[K], W: f32[N, K]) -> y: f32[N]
    const K = {k}, N = {n}
    launch workgroup 256, subgroup any, rows_per_subgroup 4
    y[n] = sum(k: W[n, k] * x[k]) layout n -> subgroup, k -> lane x 8
"""


def test_a_warm_build_judges_as_a_cold_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The object cache keeps both numbers the liveness analysis measures (codegen/liveness.py
    `Demand`: the demand and the peak with loads moved up, which the waves depend on): a build
    from the cache gives the same estimates as the build that compiled, and entries of the
    older layout (a `kernels` table without `loads_up`) are never read."""
    import sqlite3

    import fusec.codegen.build as build
    import fusec.codegen.objcache as objcache

    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    text = MATVEC.format(k=random.randrange(64, 512) * 8, n=random.randrange(64, 4096))
    cold = build.build_source(text, "mv.fuse")
    # a kernel whose loads, moved up, raise its demand: the second number matters here
    demands = [b.demand for b in cold.kernels]
    assert all(d is not None for d in demands)
    assert any(d.loads_up > d.vgprs for d in demands if d is not None), demands
    ests = [e for r in cold.manifest.regions for k in r.fused + r.unfused for e in k.estimates]
    assert any(e.loads_up > e.vgprs for e in ests), ests

    def no_compiler(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("compiled although the kernel is in the cache")

    monkeypatch.setattr(build, "compile_glsl", no_compiler)
    warm = build.build_source(text, "mv.fuse")
    assert [b.demand for b in warm.kernels] == demands
    assert warm.manifest == cold.manifest
    monkeypatch.undo()
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))

    # the same entries under the older layout, with a wrong demand: ignored, compiled again
    db = sqlite3.connect(tmp_path / "cache" / "objects" / "objects.sqlite")
    with db:
        db.execute(
            "CREATE TABLE kernels (key TEXT PRIMARY KEY, spv BLOB, vgprs INTEGER, "
            "private INTEGER, used REAL)"
        )
        db.execute(
            f"INSERT INTO kernels SELECT key, spv, vgprs + 7, private, used "
            f"FROM {objcache.OBJECTS_TABLE}"
        )
        db.execute(f"DROP TABLE {objcache.OBJECTS_TABLE}")
    db.close()
    calls = _count_compiles(monkeypatch)
    again = build.build_source(text, "mv.fuse")
    assert calls
    assert again.manifest == cold.manifest


@pytest.mark.parametrize("damage", ["well_formed", "truncated"])
def test_spir_v_reused_from_a_folder_never_enters_the_user_cache(
    damage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build folder edited by someone who re-seals its manifest can hand its SPIR-V to a
    rebuild of that folder (if it is well formed; else the kernel is compiled), but never to
    the user-wide object cache: a build into another folder compiles its own."""
    import hashlib
    import json

    import fusec.codegen.build as build
    from fusec.codegen import manifest as mf

    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    text = SOURCE.replace("N = 1000", f"N = {random.randrange(200, 5000)}")
    out = tmp_path / "out"
    good = build.build_source(text, "r.fuse")
    build.write_build(good, out)
    # a fresh user cache, so that only the folder holds the kernels
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache2"))
    name = good.kernels[0].kernel.name
    spv = bytearray((out / f"{name}.spv").read_bytes())
    if damage == "well_formed":
        spv[8:12] = random.randbytes(4)  # the header's generator word
    else:
        spv[-4:] = bytes(b ^ 0xFF for b in spv[-4:])  # an instruction that runs past the end
    (out / f"{name}.spv").write_bytes(bytes(spv))
    data = json.loads((out / "manifest.json").read_text())
    for region in data["regions"]:
        for k in region["fused"] + region["unfused"]:
            if k["name"] == name:
                k["sha256"] = hashlib.sha256(bytes(spv)).hexdigest()
    (out / "manifest.json").write_text(json.dumps(mf.seal(data)))
    reused = build.build_source(text, "r.fuse", cache_dir=out)
    want = bytes(spv) if damage == "well_formed" else good.kernels[0].spv
    assert next(b.spv for b in reused.kernels if b.kernel.name == name) == want
    elsewhere = build.build_source(text, "r.fuse")
    assert [b.spv for b in elsewhere.kernels] == [b.spv for b in good.kernels]


def test_kernels_that_differ_only_in_names_and_lines_compile_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two regions with the same body (a copy under another name, further down the file) give
    kernels whose GLSL differs only in its `// kernel` comment and `#line` directives: each is
    compiled once, and both get the same SPIR-V and estimates."""
    import fusec.codegen.build as build

    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    n = random.randrange(200, 5000)
    one = SOURCE.replace("N = 1000", f"N = {n}")
    text = one + "\n" + one.replace("region scale(", "region scale_copy(")
    calls = _count_compiles(monkeypatch)
    result = build.build_source(text, "r.fuse")
    by_name = {b.kernel.name: b for b in result.kernels}
    assert len(calls) == len({_body(b.glsl) for b in result.kernels}) < len(by_name)
    for name, b in by_name.items():
        if name.startswith("scale_copy"):
            twin = by_name[name.replace("scale_copy", "scale", 1)]
            assert b.glsl != twin.glsl and b.spv == twin.spv and b.demand == twin.demand


def test_kernels_that_differ_only_in_the_authors_names_compile_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A region copied with every buffer and constant renamed compiles to the same programs:
    each is compiled once, and the copy's kernels get the original's SPIR-V."""
    import re

    import fusec.codegen.build as build
    import fusec.codegen.objcache as objcache

    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    n = random.randrange(200, 5000)
    one = SOURCE.replace("N = 1000", f"N = {n}")
    renamed = re.sub(r"\bx\b", "inp", one.replace("region scale(", "region other("))
    renamed = re.sub(r"\bg\b", "gain", re.sub(r"\bN\b", "LEN", renamed))
    assert renamed != one
    calls = _count_compiles(monkeypatch)
    result = build.build_source(one + "\n" + renamed, "r.fuse")
    by_name = {b.kernel.name: b for b in result.kernels}
    cache = objcache.ObjectCache.__new__(objcache.ObjectCache)
    cache.salt = b"test"
    own = {
        cache.key(b.glsl, build._own_names(b.kernel))
        for b in result.kernels
        if b.kernel.name.startswith("scale")
    }
    # the copy compiled nothing of its own
    assert len(calls) == len(own) < len(by_name)
    for name, b in by_name.items():
        if name.startswith("other"):
            twin = by_name[name.replace("other", "scale", 1)]
            assert b.glsl != twin.glsl and b.spv == twin.spv and b.demand == twin.demand


def test_kernels_with_one_key_compile_to_the_same_spir_v() -> None:
    """What lets the build compile a group of kernels once holds for kernels.fuse: every
    kernel whose key it shares with another, compiled on its own, gives the same bytes."""
    import fusec.codegen.build as build
    import fusec.codegen.objcache as objcache
    from fusec.codegen.shaderc import compile_glsl

    program = build.check_source((ROOT / "kernels.fuse").read_text(), "kernels.fuse")
    cache = objcache.ObjectCache.__new__(objcache.ObjectCache)
    cache.salt = b"test"
    groups: dict[str, list[tuple[str, str]]] = {}
    for region in program.regions:
        for k in (k for p in build.products(region) for k in p):
            glsl = build.emit_kernel(k)[0]
            groups.setdefault(cache.key(glsl, build._own_names(k)), []).append((k.name, glsl))
    shared = [g for g in groups.values() if len(g) > 1]
    assert len(shared) >= 10
    for group in shared:
        spvs = {compile_glsl(glsl, name) for name, glsl in group}
        assert len(spvs) == 1, [name for name, _ in group]


def test_generated_regions_renamed_share_keys_and_spir_v() -> None:
    """The key's renaming on ops nobody wrote by hand: generated regions (the estimator's
    corpus, a fresh seed each run), each beside a copy whose buffers and constants are renamed.
    Every kernel of a copy has its twin's key, and every group of kernels that share a key (twins,
    or equal kernels of different regions), each compiled on its own, gives one SPIR-V."""
    import re

    import fusec.codegen.build as build
    import fusec.codegen.objcache as objcache
    from fusec.codegen.shaderc import compile_glsl
    from fusec.dsl.parse import parse
    from tests.estimator.corpus import case_source

    cache = objcache.ObjectCache.__new__(objcache.ObjectCache)
    cache.salt = b"test"
    seed = random.randrange(1 << 30)
    groups: dict[str, list[tuple[str, str]]] = {}
    for index in range(12):
        text = case_source(seed, index)
        (region,) = parse(text, "g.fuse").regions
        copy = text.replace(f"region {region.name}(", f"region {region.name}_copy(", 1)
        for name in [p.name for p in (*region.params, *region.outputs)] + [
            c.name for c in region.consts
        ]:
            # not the `x` of a layout's `lane x 8`
            copy = re.sub(rf"(?<!lane )\b{re.escape(name)}\b", f"{name}_r", copy)
        assert copy != text
        program = build.check_source(text + "\n" + copy, "g.fuse")
        keys: dict[str, str] = {}
        for r in program.regions:
            for k in (k for p in build.products(r) for k in p):
                glsl = build.emit_kernel(k)[0]
                keys[k.name] = cache.key(glsl, build._own_names(k))
                groups.setdefault(keys[k.name], []).append((k.name, glsl))
        for name in keys:
            if name.startswith(f"{region.name}_copy"):
                twin = name.replace(f"{region.name}_copy", region.name, 1)
                assert keys[name] == keys[twin], (seed, index, name)
    for group in groups.values():
        if len(group) > 1:
            spvs = {compile_glsl(glsl, name) for name, glsl in group}
            assert len(spvs) == 1, (seed, [name for name, _ in group])
