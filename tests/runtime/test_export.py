"""`fusec export DIR --c-header FILE` (issue 19, item 3): an engine in C runs a region from one
generated header, with no Python.  The C example (examples/engine_c) is compiled with the
system C compiler against the header and run on the default Vulkan device (lavapipe in CI) on
fresh random inputs; its output must match the numpy reference, and where the header says
barriers go must give the Python runtime's dispatches and barriers.  Also: the header is the
same bytes for the same folder, a file fusec did not write is never replaced, and a damaged
folder is refused in one sentence."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.codegen import manifest_records as mr
from fusec.dsl.check import check
from fusec.dsl.parse import parse_file
from fusec.dsl.reference import run_reference
from fusec.runtime.c_header import MARKER, schedule
from fusec.runtime.dispatch import NP_DTYPES, RegionRunner, const_values, shape_of
from fusec.runtime.verify import random_inputs, relative_error, tolerance_for
from tests.conftest import ROOT, fusec_cli

MAIN_C = ROOT / "examples" / "engine_c" / "main.c"
CFLAGS = ["-std=c99", "-O1", "-Wall", "-Wextra", "-pedantic", "-Werror"]
REGION = "rms_norm_mul_matvec"


@functools.cache
def c_toolchain() -> tuple[str | None, str]:
    """(the C compiler, "") when a program including <vulkan/vulkan.h> compiles and links
    against the loader here; (None, why not) otherwise."""
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc or gcc); make setup installs build-essential"
    probe = "#include <vulkan/vulkan.h>\nint main(void) { return vkCreateInstance == 0; }\n"
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"fusec-vkprobe-{os.getpid()}"
    proc = subprocess.run(
        [cc, "-x", "c", "-", "-o", str(out), "-lvulkan"],
        input=probe,
        capture_output=True,
        text=True,
        check=False,
    )
    out.unlink(missing_ok=True)
    if proc.returncode != 0:
        return None, "no Vulkan headers or loader to link (make setup installs libvulkan-dev)"
    return cc, ""


def compile_engine(header_dir: Path, out: Path, region: str = REGION) -> Path:
    cc, why = c_toolchain()
    if cc is None:
        pytest.skip(why)
    # beside the header: `#include "fusec_kernels.h"` looks in main.c's own folder first,
    # where `make` in examples/engine_c leaves a header of its own
    main_c = header_dir / "main.c"
    shutil.copyfile(MAIN_C, main_c)
    cmd = [cc, *CFLAGS, f"-DFUSEC_REGION=fusec_region_{region}", f"-I{header_dir}"]
    proc = subprocess.run(
        [*cmd, "-o", str(out), str(main_c), "-lvulkan"], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    return out


def export(folder: Path, header: Path, *regions: str) -> subprocess.CompletedProcess[str]:
    args = ["export", str(folder), "--c-header", str(header)]
    for r in regions:
        args += ["--region", r]
    return fusec_cli(args, capture_output=True, text=True)


def run_engine(
    exe: Path, region: mr.Region, inputs: dict[str, np.ndarray], tmp: Path, *options: str
) -> tuple[str, dict[str, np.ndarray]]:
    """Run the compiled example on `inputs` (files in region order); the output files are
    poisoned with NaN first, so an output the program did not write cannot pass."""
    files = []
    for b in region.inputs:
        path = tmp / f"{b.name}.bin"
        np.ascontiguousarray(inputs[b.name]).tofile(path)
        files.append(str(path))
    consts = const_values(region, {})
    for b in region.outputs:
        path = tmp / f"out_{b.name}.bin"
        np.full(shape_of(b, consts), np.nan, NP_DTYPES[b.dtype]).tofile(path)
        files.append(str(path))
    proc = subprocess.run([str(exe), *options, *files], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    outs = {}
    for b in region.outputs:
        raw = np.fromfile(tmp / f"out_{b.name}.bin", NP_DTYPES[b.dtype])
        outs[b.name] = raw.reshape(shape_of(b, consts)) if raw.size else raw
    return proc.stdout, outs


@pytest.mark.slow
@pytest.mark.vulkan
@pytest.mark.shaderc
def test_the_c_engine_matches_the_reference(build: Any, tmp_path: Path) -> None:
    """rms_norm_mul_matvec of kernels.fuse at K=1000, N=77, fused and unfused, from C."""
    header = tmp_path / "fusec_kernels.h"
    proc = export(build.path, header, REGION)
    assert proc.returncode == 0, proc.stderr
    exe = compile_engine(tmp_path, tmp_path / "engine_c")
    region = build.region(REGION)
    k, n = 1000, 77
    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(k).astype(np.float32)
    g = rng.standard_normal(k).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float16)
    for a in (x, g, w):
        a[a == 0] = 0.5  # never zeros
    files = []
    for name, a in (("x", x), ("g", g), ("W", w)):
        a.tofile(tmp_path / f"{name}.bin")
        files.append(str(tmp_path / f"{name}.bin"))
    out = tmp_path / "y.bin"
    program = check(parse_file(ROOT / "kernels.fuse"))
    region_ir = next(r for r in program.regions if r.name == REGION)
    ref = run_reference(region_ir, {"x": x, "g": g, "W": w}, {"K": k, "N": n})["y"]
    precision, tol = tolerance_for(region)
    for options, want in (
        ([], "fused; 1 dispatch(es), 0 barrier(s)"),
        (["--unfused"], "unfused; 3 dispatch(es), 2 barrier(s)"),
    ):
        np.full(n, np.nan, np.float32).tofile(out)  # poison
        proc = subprocess.run(
            [str(exe), *options, "-c", f"K={k}", "-c", f"N={n}", *files, str(out)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        assert want in proc.stdout, proc.stdout
        y = np.fromfile(out, np.float32)
        assert y.shape == (n,) and np.all(np.isfinite(y))
        err = relative_error(y, ref)
        print(
            f"engine_c {REGION} {' '.join(options) or 'fused'} (seed {seed}): "
            f"max rel err {err:.2e} (tol {tol:g}, {precision})"
        )
        assert err <= tol


@pytest.mark.slow
@pytest.mark.vulkan
@pytest.mark.shaderc
def test_loops_zeroed_outputs_params_and_shared_exchange_as_the_runtime_runs_them(
    build: Any, dev: Any, tmp_path: Path
) -> None:
    """The header's steps, barriers, grids, derived and run-time constants give what the Python
    runtime gives: an unfused repeat (dsv4_hc_comb, which also runs its shared-exchange variant
    on a narrow subgroup), a split-K output zeroed first (gated_ffn_down_splitk) and run-time
    parameters with derived constants (attention_split)."""
    regions = ("dsv4_hc_comb", "gated_ffn_down_splitk", "attention_split")
    proc = export(build.path, tmp_path / "fusec_kernels.h", *regions)
    assert proc.returncode == 0, proc.stderr
    for name in regions:
        region = build.region(name)
        exe = compile_engine(tmp_path, tmp_path / f"engine_{name}", name)
        consts = const_values(region, {})
        inputs = random_inputs(region, consts, np.random.default_rng())
        runner = RegionRunner(dev, build, name, consts)
        try:
            for fused in (True, False):
                want = runner.run(inputs, fused=fused)
                out, got = run_engine(
                    exe, region, inputs, tmp_path, *([] if fused else ["--unfused"])
                )
                counts = f"{want.dispatches} dispatch(es), {want.barriers} barrier(s)"
                assert f"{name}: {want.path}; {counts}" in out, (out, want)
                for b in region.outputs:
                    err = relative_error(got[b.name], want.outputs[b.name])
                    assert err <= tolerance_for(region)[1], (name, fused, b.name, err)
        finally:
            runner.close()


def _kernel(writes: str, reads: str = "", loop: int | None = None, zero: str = "") -> mr.Kernel:
    """A manifest kernel for `schedule`: one-letter buffer names."""
    names = [(b, False) for b in reads] + [(b, True) for b in writes]
    return mr.Kernel(
        name="k",
        spv="k.spv",
        sha256="0" * 64,
        stages=(),
        workgroup_size=64,
        subgroup=mr.Subgroup("any", ()),
        bindings=tuple(mr.Binding(i, b, True, w) for i, (b, w) in enumerate(names)),
        shared_floats=(),
        reduction_scratch=False,
        exchange_scratch=False,
        grid=(),
        features=(),
        zero_outputs=tuple(zero),
        derived=(),
        estimates=(),
        loop=loop,
        loop_count=None,
        exchange=None,
    )


def test_barriers_go_where_the_runtime_puts_them() -> None:
    """Before a kernel that touches a buffer written since the last barrier; in a repeat, the
    later runs see the body's own writes; a zeroing fill ends with its own barrier."""
    chain = [_kernel("a"), _kernel("b", "a"), _kernel("c", "x")]
    assert schedule(chain) == [(False, False), (True, True), (False, False)]
    loop = [_kernel("s"), _kernel("t", "s", loop=1), _kernel("s", "t", loop=1), _kernel("y", "s")]
    assert schedule(loop) == [(False, False), (True, True), (True, True), (True, True)]
    # the first run of the body needs no barrier before its first kernel (nothing it touches
    # is dirty), a repeat does (the body's last kernel wrote `v`, which the first reads)
    body = [_kernel("u", "v", loop=0), _kernel("v", "u", loop=0)]
    assert schedule(body) == [(False, True), (True, True)]
    assert schedule([_kernel("y", "x", zero="y"), _kernel("z", "y")]) == [
        (False, False),
        (True, True),
    ]


@pytest.mark.slow
@pytest.mark.shaderc
def test_the_header_is_deterministic_and_plain_c(build: Any, tmp_path: Path) -> None:
    one, two = tmp_path / "one.h", tmp_path / "sub" / "two.h"
    two.parent.mkdir()
    for header in (one, two):
        proc = export(build.path, header)
        assert proc.returncode == 0, proc.stderr
    text = one.read_bytes()
    assert text == two.read_bytes()
    assert text.decode().splitlines()[0] == MARKER
    # again into the same file: nothing changes, not even the time stamp
    before = one.stat().st_mtime_ns
    proc = export(build.path, one)
    assert proc.returncode == 0 and "unchanged" in proc.stdout
    assert one.stat().st_mtime_ns == before
    cc, why = c_toolchain()
    if cc is None:
        pytest.skip(why)
    compilers = [[cc, "-x", "c", "-std=c99"]]  # C11 and later accept what C99 -pedantic does
    cxx = shutil.which("c++")
    if cxx is not None:  # an engine in C++ includes it too
        compilers.append([cxx, "-x", "c++", "-std=c++11"])
    for compiler in compilers:
        warnings = ["-Wall", "-Wextra", "-pedantic", "-Werror", "-fsyntax-only"]
        proc = subprocess.run([*compiler, *warnings, str(one)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[:2000]


@pytest.mark.shaderc
@pytest.mark.parametrize("kind", ["foreign", "folder", "symlink", "empty"])
def test_a_file_fusec_did_not_write_is_never_replaced(
    build: Any, tmp_path: Path, kind: str
) -> None:
    target = tmp_path / "fusec_kernels.h"
    other = tmp_path / "mine.h"
    other.write_text("/* my own header */\nint x;\n")
    if kind == "foreign":
        target.write_text("/* fusec-generated-header? no: my own code */\nint y;\n")
    elif kind == "folder":
        target.mkdir()
    elif kind == "symlink":
        target.symlink_to(other)
    else:
        target.write_text("")
    before = sorted((p.name, p.is_dir()) for p in tmp_path.iterdir())
    proc = export(build.path, target, REGION)
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"fusec: error: refusing to overwrite {target}")
    assert "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) <= 2  # the sentence and its hint
    assert sorted((p.name, p.is_dir()) for p in tmp_path.iterdir()) == before  # no temporary
    assert other.read_text() == "/* my own header */\nint x;\n"
    if kind == "foreign":
        assert target.read_text().endswith("int y;\n")


@pytest.mark.slow
@pytest.mark.shaderc
def test_a_header_fusec_wrote_is_replaced(build: Any, tmp_path: Path) -> None:
    header = tmp_path / "fusec_kernels.h"
    assert export(build.path, header, REGION).returncode == 0
    header.chmod(0o640)
    proc = export(build.path, header, "add_rms_norm")
    assert proc.returncode == 0, proc.stderr
    text = header.read_text()
    assert "fusec_region_add_rms_norm" in text and "fusec_region_rms_norm_mul_matvec" not in text
    assert header.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == [header.name]


@pytest.mark.shaderc
@pytest.mark.parametrize("damage", ["edited", "missing_spv", "no_folder", "unknown_region"])
def test_a_damaged_folder_is_refused_in_one_sentence(
    build: Any, tmp_path: Path, damage: str
) -> None:
    folder = tmp_path / "b"
    shutil.copytree(build.path, folder)
    regions: tuple[str, ...] = ()
    if damage == "edited":
        path = folder / "manifest.json"
        data = json.loads(path.read_text())
        data["regions"][0]["consts"][0]["default"] += 1
        path.write_text(json.dumps(data, indent=1))
        want = "was changed after the build"
    elif damage == "missing_spv":
        (folder / f"{REGION}.spv").unlink()
        want = f"{REGION}.spv is missing"
    elif damage == "no_folder":
        shutil.rmtree(folder)
        want = "no such folder"
    else:
        regions = ("no_such_region",)
        want = "no region 'no_such_region'"
    header = tmp_path / "fusec_kernels.h"
    proc = export(folder, header, *regions)
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert lines and lines[0].startswith("fusec: error: ") and want in lines[0], proc.stderr
    assert len(lines) <= 2 and "Traceback" not in proc.stderr  # the sentence and its hint
    assert not header.exists()


TWO_C = """
#include <stdio.h>
#include "one.h"
#include "two.h"
#include "one.h" /* the same header again: read once */
int main(void)
{
    uint32_t i;
    for (i = 0; i < PA_regions_count; i++) printf("PA %s\\n", PA_regions[i]->name);
    for (i = 0; i < PB_regions_count; i++) printf("PB %s\\n", PB_regions[i]->name);
    return 0;
}
"""


@pytest.mark.shaderc
def test_headers_of_two_builds_meet_in_one_file(build: Any, tmp_path: Path) -> None:
    """Two builds exported with two `--prefix`es compile and link into one C program and list
    their own regions (with one prefix, the second header's names were the first's: the
    compiler refused them; found by a new-user probe).  The same prefix twice is an #error that
    names the option; a prefix that cannot begin C names is refused in one sentence."""
    import random

    from fusec.codegen.build import build_file

    cc, why = c_toolchain()
    if cc is None:
        pytest.skip(why)
    small = tmp_path / "small"
    build_file(ROOT / "tests" / "data" / "scale.fuse", small)
    a, b = random.sample(["qwen", "llama", "mix2", "fusec", "e7"], 2)
    names = {}
    for folder, name, prefix in ((build.path, "one.h", a), (small, "two.h", b)):
        proc = fusec_cli(
            ["export", str(folder), "--c-header", str(tmp_path / name), "--prefix", prefix],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        manifest = json.loads((Path(folder) / "manifest.json").read_text())
        names[prefix] = [r["name"] for r in manifest["regions"]]
    main_c = tmp_path / "two.c"
    main_c.write_text(TWO_C.replace("PA", a).replace("PB", b))
    exe = tmp_path / "two"
    proc = subprocess.run(
        [cc, *CFLAGS, f"-I{tmp_path}", "-o", str(exe), str(main_c)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[:2000]
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    listed = [line.split(" ", 1) for line in run.stdout.splitlines()]
    assert [n for p, n in listed if p == a] == names[a]
    assert [n for p, n in listed if p == b] == names[b]
    # one prefix for both: the compiler stops at fusec's #error, which names the way out
    proc = fusec_cli(
        ["export", str(small), "--c-header", str(tmp_path / "two.h"), "--prefix", a],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    main_c.write_text(TWO_C.replace("PA", a).replace("PB", a))
    proc = subprocess.run(
        [cc, *CFLAGS, f"-I{tmp_path}", "-o", str(exe), str(main_c)], capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert f"two fusec headers with the prefix {a} in one file" in proc.stderr
    assert "fusec export --prefix NAME" in proc.stderr
    for bad in ("Qwen", "1x", "a-b", "", "x" * 32):
        proc = fusec_cli(
            ["export", str(small), "--c-header", str(tmp_path / "bad.h"), "--prefix", bad],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 1 and "Traceback" not in proc.stderr
        assert proc.stderr.startswith(f"fusec: error: --prefix {bad!r} is not a prefix of C names")
        assert not (tmp_path / "bad.h").exists()


@pytest.mark.shaderc
def test_export_takes_a_display_name(build: Any, tmp_path: Path) -> None:
    """`--region matvec_add<q4_0>` names the instance as check, explain, occupancy and tune take
    it (export refused it; found by a new-user probe); a name of no region lists the near ones."""
    header = tmp_path / "one.h"
    proc = export(build.path, header, "matvec_add<q4_0>")
    assert proc.returncode == 0, proc.stderr
    text = header.read_text()
    assert "fusec_region_matvec_add_q4_0 = {" in text
    assert "fusec_region_matvec_add_q8_0 " not in text
    proc = export(build.path, tmp_path / "two.h", "matvec_add<q5_0>")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"no region 'matvec_add<q5_0>' in build folder {build.path}" in proc.stderr
    assert "did you mean" in proc.stderr and not (tmp_path / "two.h").exists()
