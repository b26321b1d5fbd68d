"""Fused, unfused and reference on a Vulkan device (lavapipe in CI), on fresh random inputs."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from fusec.dsl import ir
from fusec.dsl.check import check
from fusec.dsl.parse import parse_file
from fusec.dsl.reference import run_reference
from fusec.runtime.device import Device, RuntimeFailure
from fusec.runtime.dispatch import Build, RegionRunner, const_values
from fusec.runtime.verify import CheckReport, check_region
from tests.conftest import LAVAPIPE_SIZES, ROOT, check_on_lavapipe, fusec_cli, rotated_sizes

pytestmark = [pytest.mark.vulkan, pytest.mark.shaderc]
PROGRAM = check(parse_file(ROOT / "kernels.fuse"))
# (4096, 4096), the default, runs in test_every_region_keeps_a_margin_to_its_tolerance
SHAPES = [(4096, 12288), (1000, 77), (7, 3)]


@pytest.mark.slow
@pytest.mark.parametrize("region", ["rms_norm_mul_matvec", "rms_norm_mul_matvec_f32"])
@pytest.mark.parametrize(("k", "n"), SHAPES)
def test_fused_and_unfused_match_reference(
    dev: Device, build: Build, region: str, k: int, n: int
) -> None:
    if n * k * (4 if region.endswith("_f32") else 2) > dev.info.max_buffer_bytes:
        # lavapipe binds at most 128 MiB per buffer (maxStorageBufferRange): an f32 W of
        # 4096 x 12288 is refused before anything runs
        with pytest.raises(RuntimeFailure, match=r"buffer 'W' .* \(maxStorageBufferRange\)"):
            check_region(dev, build, PROGRAM.region(region), {"K": k, "N": n})
        return
    rep = check_region(dev, build, PROGRAM.region(region), {"K": k, "N": n})
    assert rep.path == "fused"
    assert [o.name for o in rep.outputs] == ["y"]
    for o in rep.outputs:
        assert o.fused_error <= o.tolerance, o
        assert o.unfused_error <= o.tolerance, o


# the decode shapes that are these regions' defaults (add_rms_norm K = 4096, the gated FFNs
# H = 4096, F = 12288) run in test_every_region_keeps_a_margin_to_its_tolerance, which checks
# what this test checks of them on its first draw (AT_DEFAULTS)
DECODE_AND_ODD = [
    ("rms_norm_mul_matvec_q8_0", {"K": 4096, "N": 12288}),
    ("rms_norm_mul_matvec_q8_0", {"K": 224, "N": 33}),
    ("rms_norm_mul_matvec_q4_0", {"K": 4096, "N": 12288}),
    ("rms_norm_mul_matvec_q4_0", {"K": 224, "N": 33}),
    ("add_rms_norm", {"K": 224}),
    ("add_rms_norm", {"K": 33}),
    ("gated_ffn", {"H": 224, "F": 33}),
    ("gated_ffn_q8_0", {"H": 224, "F": 33}),
    ("gated_ffn_q4_0", {"H": 224, "F": 33}),
    ("rms_norm_gated_ffn", {"H": 224, "F": 33}),
]


# regions with GGUF K-quant weights, whose rows are whole 256-element blocks
K_QUANT_REGIONS = [
    r.name
    for r in PROGRAM.regions
    if any(b.dtype.block == 256 for b in r.inputs if b.dtype.is_quantized)
    and "__" not in r.name  # a target's variant: test_tune checks those
]


@pytest.mark.parametrize(
    ("region", "consts", "unfused"),
    [
        ("rms_norm_mul_matvec_q4_K", {"K": 4096, "N": 12288}, 3),
        ("rms_norm_mul_matvec_q4_K", {"K": 768, "N": 33}, 3),
        ("matvec_add_q6_K", {"K": 12288, "N": 4096}, 3),
        ("matvec_add_q6_K", {"K": 768, "N": 33}, 3),
        ("matvec_add_q4_K", {"K": 12288, "N": 4096}, 3),
        ("matvec_add_q4_K", {"K": 1280, "N": 37}, 3),
        ("rms_norm_mul_matvec_q6_K", {"K": 4096, "N": 1024}, 3),
        ("rms_norm_mul_matvec_q6_K", {"K": 512, "N": 29}, 3),
    ],
)
@pytest.mark.slow
def test_k_quant_regions_at_decode_and_odd_shapes(
    dev: Device, build: Build, region: str, consts: dict[str, int], unfused: int
) -> None:
    rep = check_region(dev, build, PROGRAM.region(region), consts)
    assert rep.path == "fused"
    assert (rep.fused_dispatches, rep.fused_barriers) == (1, 0)
    assert (rep.unfused_dispatches, rep.unfused_barriers) == (unfused, unfused - 1)
    assert [o.name for o in rep.outputs] == ["y"]
    for o in rep.outputs:
        assert o.tolerance == 2e-3, o
        assert o.fused_error <= o.tolerance, o
        assert o.unfused_error <= o.tolerance, o


def test_k_quant_rows_are_whole_blocks_at_run_time(build: Build) -> None:
    with pytest.raises(RuntimeFailure, match="rows of 800 elements, not a multiple of 256"):
        const_values(build.region("matvec_add_q6_K"), {"K": 800})


@pytest.mark.slow
@pytest.mark.parametrize(("region", "consts"), DECODE_AND_ODD)
def test_new_regions_at_decode_and_odd_shapes(
    dev: Device, build: Build, region: str, consts: dict[str, int]
) -> None:
    rep = check_region(dev, build, PROGRAM.region(region), consts)
    assert rep.path == "fused"
    assert rep.fused_dispatches == 1 and rep.fused_barriers == 0
    assert rep.unfused_dispatches >= 3
    assert [o.name for o in rep.outputs] == [b.name for b in PROGRAM.region(region).outputs]
    for o in rep.outputs:
        assert o.fused_error <= o.tolerance, o
        assert o.unfused_error <= o.tolerance, o


def _norm_matvec_inputs(k: int, n: int) -> dict[str, np.ndarray]:
    """Fresh random inputs of rms_norm_mul_matvec at K = k, N = n."""
    rng = np.random.default_rng()
    return {
        "x": rng.standard_normal(k).astype(np.float32),
        "g": rng.standard_normal(k).astype(np.float32),
        "W": rng.standard_normal((n, k)).astype(np.float16),
    }


def test_fused_is_one_dispatch_and_unfused_three(dev: Device, build: Build) -> None:
    runner = RegionRunner(dev, build, "rms_norm_mul_matvec", {"K": 512, "N": 64})
    inputs = _norm_matvec_inputs(512, 64)
    try:
        fused, unfused = runner.run(inputs, fused=True), runner.run(inputs, fused=False)
    finally:
        runner.close()
    assert (fused.path, fused.dispatches, fused.barriers) == ("fused", 1, 0)
    assert (unfused.path, unfused.dispatches, unfused.barriers) == ("unfused", 3, 2)
    ref = run_reference(PROGRAM.region("rms_norm_mul_matvec"), inputs, {"K": 512, "N": 64})["y"]
    scale = np.abs(ref).max()
    assert np.abs(fused.outputs["y"] - ref).max() / scale < 2e-3
    assert np.abs(unfused.outputs["y"] - ref).max() / scale < 2e-3


def test_outputs_are_poisoned_before_each_run(dev: Device, build: Build) -> None:
    """Before a run, outputs and intermediates hold NaN, so a kernel that wrote nothing
    shows up as an infinite error instead of stale values that happen to match."""
    from fusec.runtime.dispatch import NP_DTYPES, shape_of
    from fusec.runtime.verify import relative_error

    runner = RegionRunner(dev, build, "rms_norm_mul_matvec", {"K": 64, "N": 8})
    inputs = _norm_matvec_inputs(64, 8)
    try:
        runner.run(inputs)  # leaves real values in y
        runner.prepare(inputs)  # what every run does first
        for b in [*runner.region.outputs, *runner.region.intermediates]:
            got = runner.buffer(b.name).download(NP_DTYPES[b.dtype], shape_of(b, runner.consts))
            assert np.isnan(got).all(), b.name
    finally:
        runner.close()
    assert relative_error(np.full(8, np.nan, np.float32), np.ones(8)) == float("inf")


def test_device_limit_falls_back_to_the_unfused_chain(dev: Device, build: Build) -> None:
    """K = 12288 needs 48 KiB of shared memory for xn: past lavapipe's 32 KiB, so the fused
    kernel is refused with a reason and the unfused chain runs, still correct."""
    if dev.info.max_shared_bytes >= 12288 * 4 + 1024:
        pytest.skip("device has enough shared memory for the fused kernel")
    rep = check_region(dev, build, PROGRAM.region("rms_norm_mul_matvec"), {"K": 12288, "N": 8})
    assert rep.path.startswith("fallback(needs ") and "shared memory" in rep.path
    assert rep.fused_dispatches == 3
    assert all(o.ok for o in rep.outputs)


def test_wrong_input_is_refused_before_dispatch(dev: Device, build: Build) -> None:
    runner = RegionRunner(dev, build, "rms_norm_mul_matvec", {"K": 64, "N": 8})
    good = {
        "x": np.ones(64, np.float32),
        "g": np.ones(64, np.float32),
        "W": np.ones((8, 64), np.float16),
    }
    try:
        with pytest.raises(RuntimeFailure, match=r"input 'W' must have dtype float16, not float32"):
            runner.run({**good, "W": np.ones((8, 64), np.float32)})
        with pytest.raises(RuntimeFailure, match=r"input 'x' must have shape \(64,\), not \(63,\)"):
            runner.run({**good, "x": np.ones(63, np.float32)})
    finally:
        runner.close()


def test_constant_out_of_range_is_refused(build: Build) -> None:
    from fusec.runtime.dispatch import const_values

    with pytest.raises(RuntimeFailure, match=r"constant 'K' = 0 is outside its range 1 .. 12288"):
        const_values(build.region("rms_norm_mul_matvec"), {"K": 0})
    with pytest.raises(RuntimeFailure, match="has no constant 'Q'"):
        const_values(build.region("rms_norm_mul_matvec"), {"Q": 1})


def _kind(region: ir.Region) -> str:
    """What a region is, for spreading kernels.fuse's regions over lavapipe's subgroup sizes:
    the first that applies of q8_0x blocks, K-quant weights, q8_0/q4_0 weights, a tile,
    attention, rope, the other hyper-connection regions, and f16/f32 (matrix-vector products,
    norms, the router, the down projections)."""
    dtypes = {b.dtype for b in (*region.inputs, *region.outputs)}
    if any(d.value == "q8_0x" for d in dtypes):
        return "q8_0x"
    if region.name in K_QUANT_REGIONS:
        return "k_quant"
    if any(d.is_quantized for d in dtypes):
        return "quantized"
    if region.tile is not None:
        return "tiles"
    if region.name.startswith(("attention", "softmax")):
        return "attention"
    if "rope" in region.name:
        return "rope"
    if region.name.startswith("dsv4_hc"):
        return "hyper_connections"
    return "f16_f32"


# every region of kernels.fuse but a target's variant (test_tune checks those), by kind
KINDS: dict[str, list[str]] = {}
for _r in PROGRAM.regions:
    if "__" not in _r.name:
        KINDS.setdefault(_kind(_r), []).append(_r.name)
SIZES = rotated_sizes(KINDS)


@pytest.mark.slow
@pytest.mark.parametrize(("width", "subgroup"), LAVAPIPE_SIZES)
def test_check_at_lavapipe_subgroup_sizes(kernels_folder: Path, width: int, subgroup: int) -> None:
    """LP_NATIVE_VECTOR_WIDTH sets lavapipe's subgroup size (bits / 32); `fusec check` of the
    session's build of kernels.fuse (the deployed path: no compiler run in the child).

    Each region runs at two of the three sizes (conftest.rotated_sizes, the same two in every
    run): every region runs at 4 or 16 lanes, away from lavapipe's default of 8, and each size
    runs regions of every kind (_kind: q8_0x, K-quant, q8_0/q4_0, tiles, attention, rope,
    hyper-connections, f16/f32); 16 lanes, slow to compile, run a quarter of each kind."""
    here = [name for names in KINDS.values() for name in names if subgroup in SIZES[name]]
    assert {k for k, names in KINDS.items() if set(names) & set(here)} == set(KINDS)
    assert len(KINDS) == 8 and all(len(names) >= 2 for names in KINDS.values())
    assert {"rms_norm_mul_matvec_q4_K", "matvec_add_q6_K"} <= set(K_QUANT_REGIONS)
    rms = [r for r in here if r.endswith(("matvec", "matvec_f32"))]
    k_quant = [r for r in here if r in K_QUANT_REGIONS]
    # a q8_0x output is whole 32-element blocks (README; a run at F = 33 is refused)
    blocks = [
        r
        for r in here
        if r not in k_quant and any(b.dtype.value == "q8_0x" for b in PROGRAM.region(r).outputs)
    ]
    rest = [r for r in here if r not in rms and r not in k_quant and r not in blocks]
    runs = [
        (rms, {"K": 1000, "N": 77}),
        # K-quant rows are whole 256-element blocks
        (k_quant, {"K": 768}),
        (rest, {"K": 224, "N": 33, "H": 224, "F": 33}),
        (blocks, {"K": 224, "H": 224, "F": 96}),
    ]
    ok = 0
    for regions, values in runs:
        if regions:
            # only constants some of the run's regions have (another name is refused)
            names = {c.name for r in regions for c in PROGRAM.region(r).consts}
            consts = [a for n, v in values.items() if n in names for a in ("--const", f"{n}={v}")]
            args = [str(kernels_folder), *(a for r in regions for a in ("--region", r)), *consts]
            ok += check_on_lavapipe(args, width, subgroup).count(" ok\n")
    assert ok == sum(len(PROGRAM.region(r).outputs) for r in here)


@pytest.mark.slow
def test_check_reports_a_bad_device_name(root: Path) -> None:
    proc = fusec_cli(
        ["check", "kernels.fuse", "--device", "no-such-gpu"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith("fusec: error: no Vulkan device matches 'no-such-gpu'")
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("region", "dispatches", "barriers"),
    [("gated_ffn_down_splitk", 1, 1), ("gated_ffn_down", 2, 1)],
)
@pytest.mark.slow
def test_down_projection_variants(
    dev: Device, build: Build, region: str, dispatches: int, barriers: int
) -> None:
    """Split-K: one kernel adding float-atomic partial sums into a zeroed output (the fill
    needs a barrier); two kernels: h in VRAM between them.  At H = 224, F = 33; the defaults
    (H = 4096, F = 12288) run in test_every_region_keeps_a_margin_to_its_tolerance, which
    checks the same of them (AT_DEFAULTS)."""
    rep = check_region(dev, build, PROGRAM.region(region), {"H": 224, "F": 33})
    _assert_down_projection(dev, rep, dispatches, barriers)
    for o in rep.outputs:
        assert o.fused_error <= o.tolerance and o.unfused_error <= o.tolerance, o


def _assert_down_projection(dev: Device, rep: CheckReport, dispatches: int, barriers: int) -> None:
    if rep.region.endswith("splitk") and not dev.info.atomic_float:
        assert rep.path.startswith("fallback(device lacks shaderBufferFloat32AtomicAdd")
    else:
        assert rep.path == "fused"
        assert (rep.fused_dispatches, rep.fused_barriers) == (dispatches, barriers)
    assert rep.unfused_dispatches == 4


def _assert_fused(dev: Device, rep: CheckReport) -> None:
    assert rep.path == "fused", rep


def _assert_one_dispatch(dev: Device, rep: CheckReport) -> None:
    assert rep.path == "fused"
    assert rep.fused_dispatches == 1 and rep.fused_barriers == 0
    assert rep.unfused_dispatches >= 3


# what other tests check of a region's run at its default (decode) constants, besides its
# errors, checked on the draw at the defaults of test_every_region_keeps_a_margin_to_its_tolerance
# instead of a run of their own (one such run costs seconds: a 4096 x 12288 weight, its
# reference in float64)
AT_DEFAULTS: dict[str, Callable[[Device, CheckReport], None]] = {
    **dict.fromkeys(("rms_norm_mul_matvec", "rms_norm_mul_matvec_f32"), _assert_fused),
    **dict.fromkeys(
        ("add_rms_norm", "gated_ffn", "gated_ffn_q8_0", "gated_ffn_q4_0", "rms_norm_gated_ffn"),
        _assert_one_dispatch,
    ),
    "gated_ffn_down_splitk": lambda dev, rep: _assert_down_projection(dev, rep, 1, 1),
    "gated_ffn_down": lambda dev, rep: _assert_down_projection(dev, rep, 2, 1),
}


def _errors(stdout: str) -> dict[str, tuple[float, float]]:
    """Per output of a `fusec check` run: (fused, unfused) errors as printed."""
    found = {}
    for m in re.finditer(r"^  (\w+): max rel err fused (\S+), unfused (\S+) \(", stdout, re.M):
        found[m.group(1)] = (float(m.group(2)), float(m.group(3)))
    return found


@pytest.mark.slow
def test_draws_report_the_worst_of_their_inputs(root: Path, tmp_path: Path) -> None:
    """--draws N --seed S is the worst, output by output, of the N runs --seed S + i."""
    base = ["check", "kernels.fuse", "--region", "add_rms_norm", "--const", "K=1000"]
    single = [
        _errors(fusec_cli([*base, "--seed", str(s)], capture_output=True, text=True).stdout)
        for s in (11, 12, 13)
    ]
    run = fusec_cli([*base, "--seed", "11", "--draws", "3"], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "worst of 3 draws" in run.stdout
    drawn = _errors(run.stdout)
    assert set(drawn) == {"h", "out"}
    assert len({e for one in single for e in one.values()}) > 1  # the draws differ
    for name, (fused, unfused) in drawn.items():
        assert fused == max(one[name][0] for one in single)
        assert unfused == max(one[name][1] for one in single)


# draws of fresh inputs per region, each with an eighth of a matrix-vector region's rows
# (_fewer_rows): every row is a dot product of the default length, so the draws sample the
# errors of rows as long as at the defaults (beside another test worker on two cores: 168 s with
# three draws, 235 s with four; each run of the suite draws afresh).  The regions of AT_DEFAULTS
# draw once, at their defaults: all the rows, eight times those of a later draw where there are
# fewer (the down projections have no fewer: one draw of 4096 x 12288 weights, 7 s each).  A
# run of 2026-12-03 used at most 1.5 % of a tolerance (dsv4_hc_site.mix), the down projections
# 0.04 %, against the 50 % asserted.
MARGIN_DRAWS = 2


def _fewer_rows(region: ir.Region) -> dict[str, int]:
    """Constants for the margin test's later draws: an eighth of the rows of a matrix-vector
    region (a constant that is a 1-D output's length and the first, not the last, dimension of
    a matrix input: `F` of gated_ffn, `H` of gated_ffn_down, `N` of matvec_add), every
    contraction as long as at the defaults.  Each row is its own dot product over the same
    length, so its error does not depend on how many rows there are; the rows' inputs cost
    seconds a draw in the float64 reference (a 4096 x 12288 weight)."""
    matrices = [b.shape for b in region.inputs if len(b.shape) >= 2]
    out = {}
    for b in region.outputs:
        match b.shape:
            case (ir.ConstRef(c),) if any(s[0] == b.shape[0] for s in matrices) and not any(
                s[-1] == b.shape[0] for s in matrices
            ):
                if c.default % 8 == 0 and c.default // 8 >= max(c.lo, 1):
                    out[c.name] = int(c.default) // 8
    return out


@pytest.mark.slow
def test_every_region_keeps_a_margin_to_its_tolerance(dev: Device, build: Build) -> None:
    """Over fresh draws (MARGIN_DRAWS; one at the defaults for AT_DEFAULTS), every output of
    every region stays well inside its tolerance: a region whose error approaches the tolerance
    on some inputs makes checks flaky (the reason `attention_combine` and `dsv4_hc_site` declare
    their inputs' values)."""
    worst: dict[str, float] = {}
    checked = set()
    for region in PROGRAM.regions:
        if region.instance is not None and region.instance.target is not None:
            continue  # a target's variant: the same math at another launch (test_tune)
        # a q8_0x output's error is 0 or a whole quant step, where a value lies within f32
        # rounding of a quant boundary: its tolerance is that step, and no margin can hold
        blocks = {b.name for b in region.outputs if b.dtype.value == "q8_0x"}
        at_defaults = region.name in AT_DEFAULTS
        for _ in range(1 if at_defaults else MARGIN_DRAWS):
            rep = check_region(dev, build, region, None if at_defaults else _fewer_rows(region))
            assert [o.name for o in rep.outputs] == [b.name for b in region.outputs]
            if at_defaults:
                AT_DEFAULTS[region.name](dev, rep)
                checked.add(region.name)
            for o in rep.outputs:
                key = f"{region.name}.{o.name}"
                if o.name in blocks:
                    assert max(o.fused_error, o.unfused_error) <= o.tolerance, (key, o)
                    continue
                if o.tolerance == 0:  # an integer output (u32, i32): compared exactly
                    assert o.fused_error == 0 and o.unfused_error == 0, (key, o)
                    continue
                used = max(o.fused_error, o.unfused_error) / o.tolerance
                worst[key] = max(worst.get(key, 0.0), used)
    assert max(worst.values()) < 0.5, sorted(worst.items(), key=lambda kv: -kv[1])[:5]
    assert checked == set(AT_DEFAULTS)


def _refused_at_run_constants(
    tmp_path: Path, header: str, consts: str, line: str, run: dict[str, int]
) -> tuple[str, str, str, str]:
    """`fusec check` of a one-stage region (`header`, its `consts` line, `launch workgroup 64`,
    the stage `line`, line 4) at the run's constants: refused, exit 1, no traceback; the
    diagnostic's first line, its shown source line, caret line and hint."""
    src = tmp_path / "r.fuse"
    src.write_text(f"{header}\n    const {consts}\n    launch workgroup 64\n{line}\n")
    args = ["check", str(src), *(a for k, v in run.items() for a in ("--const", f"{k}={v}"))]
    done = fusec_cli(args, capture_output=True, text=True)
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    first, shown, caret, hint = done.stderr.splitlines()[:4]
    assert first.startswith(f"{src}:4:"), first
    assert shown.strip() == line.strip()
    assert hint.startswith("  hint: choose constants"), hint
    return first, shown, caret, hint


def test_an_index_leaving_its_dimension_at_run_constants_is_shown_at_the_index(
    tmp_path: Path,
) -> None:
    """Constants the checker did not try (`--const n_rot=...` past `D`) make a partner index
    leave its dimension: a diagnostic with FILE:LINE:COL and a caret under that index, before
    any dispatch (issue 15)."""
    import random

    d = random.choice([16, 32, 64])
    n_rot = d + 2 * random.randint(1, 8)
    line = "    y[h: H, d: D] = x[h, d] + x[h, (d + n_rot / 2) % n_rot]"
    first, _, caret, _ = _refused_at_run_constants(
        tmp_path,
        "region partner(x: f32[H, D]) -> y: f32[H, D]",
        "H = 4 in 1 .. 64, D = 64 in 2 .. 256, n_rot = 64 in 2 .. 256",
        line,
        {"D": d, "n_rot": n_rot},
    )
    col = line.index("(d + n_rot") + 1
    assert first.split(": error: ")[0].endswith(f":4:{col}")
    assert "error: in region 'partner' at " in first
    assert f"past the {d} element(s) of its dimension 1" in first
    assert caret.strip() == "^" + "~" * (len("(d + n_rot / 2) % n_rot") - 1)


def test_a_divisor_that_is_zero_at_run_constants_is_shown_at_the_divisor(tmp_path: Path) -> None:
    """`k[h / (NQ / NK), d]` needs NK to divide NQ, which ranges cannot state: `--const` with
    NK > NQ makes the divisor 0, refused at the divisor before any dispatch (found by a
    new-user probe: the device ran the undefined division and `check` reported a MISMATCH)."""
    import random

    nq = random.randint(1, 16)
    nk = random.randint(nq + 1, 64)
    line = "    y[h, d] = k[h / (NQ / NK), d]"
    first, _, caret, _ = _refused_at_run_constants(
        tmp_path,
        "region gqa(k: f32[NK, D]) -> y: f32[NQ, D]",
        "NQ = 8 in 1 .. 64, NK = 2 in 1 .. 64, D = 16 in 1 .. 128",
        line,
        {"NQ": nq, "NK": nk},
    )
    col = line.index("NQ / NK") + 1
    assert first.split(": error: ")[0].endswith(f":4:{col}")
    assert f"error: in region 'gqa' at NQ={nq}, NK={nk}" in first
    assert "the divisor '(NQ / NK)' of '/' is 0" in first, first
    assert caret.strip() == "^" + "~" * 6
