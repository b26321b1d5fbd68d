"""Run-time values (issue 13, part 4): constants, seeds, sizes and input values that a region
cannot run on are refused in one sentence before anything runs; infinities that every product
and the reference agree on are no mismatch; a closed device refuses use instead of aborting."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from typing import Any

import attrs
import numpy as np
import pytest

from fusec.codegen import manifest_records as mr
from fusec.codegen.build import build_source, write_build
from fusec.dsl.check import check
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.parse import parse_file
from fusec.dsl.reference import quantize, run_reference
from fusec.dsl.types import DType
from fusec.runtime.device import Device, RuntimeFailure
from fusec.runtime.dispatch import Build, RegionRunner, buffer_bytes, const_values
from fusec.runtime.verify import check_region, relative_error, select_consts
from tests.conftest import ROOT, fusec_cli

PROGRAM = check(parse_file(ROOT / "kernels.fuse"))

# `square` overflows f32 for x above 1.84e19: the kernels and the reference (float64, rounded to
# f32) round the same exact product, so they agree bit for bit, infinities included.  `wide`
# draws f16 values up to 1e5, past f16's largest (65504): some are infinite.
TEXT = """
region square(x: f32[K] in 1e18 .. 1e20) -> y: f32[K]
    const K = 256 in 1 .. 4096
    launch workgroup 64
    y[k] = x[k] * x[k]

region wide(x: f16[K] in 1 .. 100000) -> y: f32[K]
    const K = 256 in 1 .. 4096
    launch workgroup 64
    y[k] = x[k] * 2.0

region intread(x: i32[K] in 3 .. 1000, u: u32[K] in 7 .. 900) -> y: f32[K]
    const K = 256 in 1 .. 4096
    launch workgroup 64
    y[k] = float(x[k] / 7 + u[k] / 9) + float((x[k] + u[k]) % 5) + select(u[k] - 7 < 450, 1., 0.)

region nanmax(x: f32[K] in 1 .. 2, z: f32[K]) -> i: u32[1], y: f32[1]
    const K = 256 in 1 .. 4096
    launch workgroup 64
    m = argmax(k: sqrt(0.0 - x[k])) @ workgroup
    i[j: 1] = m
    y[j: 1] = z[m]

region root(x: f32[K] in -4 .. 4) -> y: f32[K]
    const K = 256 in 1 .. 4096
    launch workgroup 64
    y[k] = sqrt(x[k]) + x[k]
"""


@pytest.fixture(scope="module")
def values_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Build, Any]:
    result = build_source(TEXT, "values.fuse")
    out = tmp_path_factory.mktemp("values") / "b"
    write_build(result, out)
    return Build.load(out), result.program


def _check(build: Build, *args: str) -> Any:
    """`fusec check` on the session's build folder of kernels.fuse."""
    return fusec_cli(["check", str(build.path), *args], capture_output=True, text=True)


def _add_rms_norm_inputs(k: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {n: rng.standard_normal(k).astype(np.float32) for n in ("a", "b", "g")}


# 1. constant names


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_check_refuses_a_constant_of_no_selected_region(build: Build) -> None:
    run = _check(build, "--region", "add_rms_norm", "--const", "ZZ=3")
    assert run.returncode == 1
    assert (
        run.stderr == "fusec: error: no selected region has a constant 'ZZ' (constants: K, eps)\n"
    )
    assert run.stdout == ""  # refused before the device line or any region


@pytest.mark.shaderc
def test_a_constant_of_some_selected_region_goes_to_those_only(build: Build) -> None:
    regions = [PROGRAM.region("add_rms_norm"), PROGRAM.region("gated_ffn")]
    assert select_consts(build, regions, {"K": 64, "F": 8}) == {
        "add_rms_norm": {"K": 64},
        "gated_ffn": {"F": 8},
    }


# 2. constant values and seeds


@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize(
    ("const", "message"),
    [
        ("K=1e39", "constant 'K' = 1e+39 is outside its range 1 .. 1048576"),
        ("K=2.5", "constant 'K' is u32: it must be a whole number, not 2.5"),
        (
            "eps=1e39",
            "constant 'eps' = 1e+39 is outside the f32 range -3.40282e+38 .. 3.40282e+38",
        ),
        ("eps=inf", "constant 'eps' must be a finite number, not inf"),
        (
            "eps=1e-50",
            "constant 'eps' = 1e-50 rounds to 0 in f32, whose least magnitude is 1.4e-45\n"
            "  hint: use 0, or a magnitude of at least 1.4e-45",
        ),
        ("eps=nan", "constant 'eps' must be a finite number, not nan"),
    ],
)
def test_check_refuses_constants_their_dtype_or_range_cannot_hold(
    build: Build, const: str, message: str
) -> None:
    run = _check(build, "--region", "add_rms_norm", "--const", const)
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr == f"fusec: error: {message}\n"


def test_integer_constants_stay_within_their_dtype() -> None:
    """A u32 constant without a declared range still has the range of a u32 (and an i32 of an
    i32): past it, packing the specialization constant failed with an internal error."""
    region = mr.Region(
        name="r",
        line=1,
        inputs=(),
        outputs=(),
        consts=(
            mr.Const("N", "u32", 4, None, None, 0, False),
            mr.Const("S", "i32", 0, None, None, 1, False),
        ),
        state_writes=(),
        launch=mr.Launch(64, mr.Subgroup("any", ()), 1),
        budget=(),
        verdicts=(),
        fused=(),
        unfused=(),
        intermediates=(),
    )
    assert const_values(region, {"N": 2**32 - 1, "S": -(2**31)}) == {
        "N": 2**32 - 1,
        "S": -(2**31),
    }
    cases = [
        ({"N": 2**32}, r"constant 'N' = 4294967296 is outside the u32 range 0 \.\. 4294967295"),
        ({"N": -1}, r"constant 'N' = -1 is outside the u32 range 0 \.\. 4294967295"),
        ({"N": 10**400}, r"constant 'N' = 1000.* is outside the u32 range"),
        ({"S": 2**31}, r"constant 'S' = 2147483648 is outside the i32 range -2147483648 \.\. "),
        ({"N": "7"}, r"constant 'N' must be a number, not '7'"),
    ]
    for overrides, message in cases:
        with pytest.raises(RuntimeFailure, match=message):
            const_values(region, overrides)


@pytest.mark.shaderc
def test_check_refuses_a_negative_or_too_large_seed(build: Build) -> None:
    for seed in ("-1", str(2**64)):
        run = _check(build, "--region", "add_rms_norm", "--seed", seed)
        assert run.returncode == 2, run.stderr
        assert run.stderr.splitlines()[-1] == (
            f"fusec check: error: argument --seed: {seed} is not from 0 to {2**64 - 1}"
        )
        assert run.stdout == ""


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_check_region_refuses_a_negative_seed(dev: Device, build: Build) -> None:
    with pytest.raises(
        RuntimeFailure, match=r"^fusec: error: the seed must be from 0 to \d+, not -1$"
    ):
        check_region(dev, build, PROGRAM.region("add_rms_norm"), {"K": 64}, seed=-1)


# 3. sizes


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_sizes_past_what_the_device_holds_are_refused_before_anything_is_drawn(
    dev: Device, build: Build
) -> None:
    """N = 1048576 is inside the declared range, but W (f16) takes 8 GiB, and the float64 draw
    of it 32 GiB: numpy failed to allocate that, an internal error."""
    if dev.info.max_buffer_bytes >= 8 * 2**30 and dev.info.memory_bytes >= 12 * 2**30:
        pytest.skip("the device holds these buffers; the check would run for minutes")
    with pytest.raises(RuntimeFailure) as exc:
        check_region(dev, build, PROGRAM.region("rms_norm_mul_matvec"), {"K": 4096, "N": 2**20})
    message = exc.value.diagnostics[0].message
    assert re.fullmatch(
        r"buffer 'W' of region 'rms_norm_mul_matvec' at K=4096, N=1048576 would take 8\.0 GiB, "
        r"more than the .* one buffer may span on '.*' \(maxStorageBufferRange\)"
        r"|region 'rms_norm_mul_matvec' at K=4096, N=1048576 needs .* of buffers "
        r"\('W' 8\.0 GiB, .*\), more than the .* of device memory on '.*'",
        message,
    ), message
    # `fusec check` refuses it before any region runs, the one before it too
    run = _check(
        build, "--region", "add_rms_norm", "--region", "rms_norm_mul_matvec", "--const", "N=1048576"
    )
    assert (run.returncode, run.stdout) == (1, "")
    assert run.stderr == f"fusec: error: {message}\n  hint: choose smaller constants\n"


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_a_buffer_longer_than_a_binding_may_span_is_refused(dev: Device, build: Build) -> None:
    saved = dev.info
    dev.info = attrs.evolve(saved, max_buffer_bytes=2**20)
    try:
        with pytest.raises(RuntimeFailure) as exc:
            check_region(dev, build, PROGRAM.region("add_rms_norm"), {"K": 2**19})
    finally:
        dev.info = saved
    assert exc.value.diagnostics[0].message == (
        "buffer 'a' of region 'add_rms_norm' at K=524288 would take 2.0 MiB, more than the "
        f"1.0 MiB one buffer may span on '{saved.name}' (maxStorageBufferRange)"
    )


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_buffers_past_the_device_memory_are_refused_before_allocating(
    dev: Device, build: Build
) -> None:
    """Summed over the region's buffers, against the device-local heap; a RegionRunner
    refuses before allocating any of them."""
    total = sum(buffer_bytes(build.region("add_rms_norm"), {"K": 2**16, "eps": 1e-6}).values())
    saved = dev.info
    dev.info = attrs.evolve(saved, memory_bytes=2**20)
    runner = RegionRunner(dev, build, "add_rms_norm", {"K": 2**16})
    try:
        with pytest.raises(RuntimeFailure) as exc:
            runner.run(_add_rms_norm_inputs(2**16))
        assert runner._buffers == {}
    finally:
        dev.info = saved
        runner.close()
    message = exc.value.diagnostics[0].message
    assert message == (
        f"region 'add_rms_norm' at K=65536 needs {total / 2**20:.1f} MiB of buffers "
        "('a' 256.0 KiB, 'b' 256.0 KiB, 'g' 256.0 KiB, ...), more than the 1.0 MiB of device "
        f"memory on '{saved.name}'"
    )


def _raise(exc: type[Exception]) -> Any:
    def fail(*args: object, **kwargs: object) -> Any:
        raise exc()

    return fail


@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize(
    ("function", "error", "message"),
    [
        (
            "vkCreateBuffer",
            "VkErrorOutOfDeviceMemory",
            r"ran out of device memory creating a 256-byte buffer",
        ),
        (
            "vkAllocateMemory",
            "VkErrorOutOfHostMemory",
            r"ran out of host memory allocating 256 bytes for a buffer",
        ),
        (
            "vkCreateShaderModule",
            "VkErrorOutOfDeviceMemory",
            r"ran out of device memory creating a pipeline",
        ),
        ("vkQueueSubmit", "VkErrorOutOfHostMemory", r"ran out of host memory submitting commands"),
    ],
)
def test_vulkan_out_of_memory_is_one_sentence(
    dev: Device,
    build: Build,
    monkeypatch: pytest.MonkeyPatch,
    function: str,
    error: str,
    message: str,
) -> None:
    runner = RegionRunner(dev, build, "add_rms_norm", {"K": 64})
    monkeypatch.setattr(dev.vk, function, _raise(getattr(dev.vk, error)))
    try:
        with pytest.raises(RuntimeFailure) as exc:
            runner.run(_add_rms_norm_inputs(64))
    finally:
        monkeypatch.undo()
        runner.close()
    assert re.fullmatch(f"'{re.escape(dev.info.name)}' {message}", exc.value.diagnostics[0].message)


# 4. non-finite inputs


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_nonfinite_inputs_are_refused_unless_allowed(dev: Device, build: Build) -> None:
    """NaN in `a` reaches h (a + b) where it is, and every element of out (a norm over h):
    refused with a count, and with allow_nonfinite run, NaN matching the reference's NaN."""
    inputs = _add_rms_norm_inputs(64)
    inputs["a"][[3, 10, 40]] = [np.nan, np.inf, -np.inf]
    consts = {"K": 64, "eps": 1e-6}
    runner = RegionRunner(dev, build, "add_rms_norm", {"K": 64})
    try:
        with pytest.raises(RuntimeFailure) as exc:
            runner.run(inputs)
        got = runner.run(inputs, allow_nonfinite=True).outputs
    finally:
        runner.close()
    d = exc.value.diagnostics[0]
    assert d.message == (
        "input 'a' of region 'add_rms_norm' holds 3 non-finite values (NaN or infinity)"
    )
    assert d.hint == "pass allow_nonfinite=True (fusec check --allow-nonfinite) to run on them"
    with np.errstate(all="ignore"):
        ref = run_reference(PROGRAM.region("add_rms_norm"), inputs, consts)
    assert np.isnan(got["h"][3]) and got["h"][10] == np.inf and got["h"][40] == -np.inf
    assert np.isnan(got["out"]).all() and np.isnan(ref["out"]).all()
    assert relative_error(got["h"], ref["h"], allow_nonfinite=True) < 1e-6
    assert relative_error(got["out"], ref["out"], allow_nonfinite=True) == 0.0
    assert relative_error(got["out"], ref["out"]) == float("inf")


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_nonfinite_block_scales_are_refused(dev: Device, build: Build) -> None:
    rng = np.random.default_rng(3)
    w = quantize(rng.standard_normal((4, 64)).astype(np.float32), DType.Q8_0)
    w[1, 34:36] = np.array([np.inf], np.float16).view(np.uint8)  # row 1, block 1: d = inf
    inputs = {
        "x": rng.standard_normal(64).astype(np.float32),
        "g": rng.standard_normal(64).astype(np.float32),
        "W": w,
    }
    runner = RegionRunner(dev, build, "rms_norm_mul_matvec_q8_0", {"K": 64, "N": 4})
    try:
        with pytest.raises(RuntimeFailure) as exc:
            runner.run(inputs)
    finally:
        runner.close()
    assert exc.value.diagnostics[0].message == (
        "input 'W' of region 'rms_norm_mul_matvec_q8_0' holds 1 non-finite block scale "
        "(NaN or infinity)"
    )


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_check_refuses_inputs_drawn_past_their_dtype_unless_allowed(
    dev: Device, values_build: tuple[Build, Any]
) -> None:
    build, program = values_build
    with pytest.raises(RuntimeFailure) as exc:
        check_region(dev, build, program.region("wide"), seed=5)
    assert re.fullmatch(
        r"input 'x' of region 'wide' holds \d+ non-finite values \(NaN or infinity\)",
        exc.value.diagnostics[0].message,
    )
    rep = check_region(dev, build, program.region("wide"), seed=5, allow_nonfinite=True)
    assert rep.ok, rep.outputs
    run = fusec_cli(
        ["check", str(build.path), "--region", "wide", "--seed", "5", "--allow-nonfinite"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert run.stderr == "" and "  y: max rel err fused 0.00e+00, unfused 0.00e+00" in run.stdout
    run = fusec_cli(
        ["check", str(build.path), "--region", "wide", "--seed", "5"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    assert re.fullmatch(
        r"fusec: error: input 'x' of region 'wide' holds \d+ non-finite values \(NaN or "
        r"infinity\)\n  hint: pass allow_nonfinite=True \(fusec check --allow-nonfinite\) to "
        r"run on them\n",
        run.stderr,
    ), run.stderr


# 5. infinities in outputs


def test_the_same_infinity_in_both_is_no_error() -> None:
    ref = np.array([1.0, np.inf, -np.inf, 4.0], np.float32)
    got = np.array([1.0, np.inf, -np.inf, 4.004], np.float32)
    assert relative_error(got, ref) == pytest.approx(0.001, rel=1e-3)  # scale: finite places
    for wrong in ([1.0, -np.inf, -np.inf, 4.0], [1.0, 3e38, -np.inf, 4.0], [1, np.nan, -np.inf, 4]):
        assert relative_error(np.array(wrong, np.float32), ref) == float("inf"), wrong
    assert relative_error(ref, got) == pytest.approx(0.001 / 1.001, rel=1e-3)
    assert relative_error(np.full(3, np.inf), np.full(3, np.inf)) == 0.0


def test_nan_matches_nan_only_when_nonfinite_values_are_allowed() -> None:
    ref = np.array([1.0, np.nan, 2.0])
    assert relative_error(ref.copy(), ref) == float("inf")
    assert relative_error(ref.copy(), ref, allow_nonfinite=True) == 0.0
    assert relative_error(np.array([1.0, 0.0, 2.0]), ref, allow_nonfinite=True) == float("inf")
    assert relative_error(np.array([1.0, np.nan, 2.0]), np.ones(3), True) == float("inf")


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_outputs_infinite_in_every_product_and_the_reference_match(
    dev: Device, values_build: tuple[Build, Any]
) -> None:
    build, program = values_build
    for seed in range(3):
        rep = check_region(dev, build, program.region("square"), seed=seed)
        assert rep.ok, rep.outputs
        assert rep.outputs[0].fused_error == 0.0 and rep.outputs[0].unfused_error == 0.0
    run = fusec_cli(
        ["check", str(build.path), "--region", "square"], capture_output=True, text=True
    )
    assert (run.returncode, run.stderr) == (0, "")  # on main: MISMATCH, and numpy's warnings
    assert "  y: max rel err fused 0.00e+00, unfused 0.00e+00 (tol 0.0001, f32) ok" in run.stdout


# 6. a closed device

AFTER_CLOSE = """
import sys
import numpy as np
from fusec.runtime.buffers import DeviceBuffer
from fusec.runtime.device import Device, RuntimeFailure
from fusec.runtime.dispatch import Build, RegionRunner
from fusec.runtime.pipelines import Pipeline

build = Build.load(sys.argv[1])
dev = Device()
print(dev.info.name)
runner = RegionRunner(dev, build, "add_rms_norm", {"K": 64})
x = np.ones(64, np.float32)
runner.run({"a": x, "b": x, "g": x})
buf = DeviceBuffer(dev, 256)
dev.close()
for use in (
    lambda: runner.run({"a": x, "b": x, "g": x}),
    lambda: RegionRunner(dev, build, "add_rms_norm", {"K": 64}),
    lambda: DeviceBuffer(dev, 64),
    lambda: buf.upload(x),
    lambda: buf.download(np.float32, (64,)),
    lambda: Pipeline(dev, b"", 1, [], None, False),
):
    try:
        use()
        print("accepted")
    except RuntimeFailure as exc:
        print(exc.diagnostics[0].message)
runner.close()  # its buffers and pipelines went with the device: nothing to destroy
buf.destroy()
print("done")
"""


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_a_closed_device_refuses_use(build: Build) -> None:
    """In a child process: on main, using a RegionRunner after its device was closed aborted
    the interpreter (a Vulkan call on a destroyed device)."""
    run = subprocess.run(
        [sys.executable, "-c", AFTER_CLOSE, str(build.path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    name, *said = run.stdout.splitlines()
    assert said == [f"the Vulkan device '{name}' is closed"] * 6 + ["done"]


# 5. indices at the run's constants


GATHER = """
region fold(x: f32[M]) -> y: f32[N]
    const N = 64 in 1 .. 4096, M = 64 in 1 .. 4096
    launch workgroup 64
    y[i] = x[i % N] * 2.0
"""


@pytest.mark.shaderc
def test_an_index_the_run_s_constants_push_past_its_dimension_is_refused(
    build: Build, tmp_path: Any
) -> None:
    """The checker tries the constants at three settings; a run may choose others. `fusec
    check --const` refuses, with a diagnostic at the index naming the value it reaches,
    constants at which an index leaves its dimension (issue 15: `--const n_rot=200` in a RoPE
    region was an internal error), and accepts those at which it does not."""
    import random

    regions = [PROGRAM.region("qkv_rope")]
    consts = {c.name: c for c in PROGRAM.region("qkv_rope").consts}
    d = int(consts["D"].default)
    top = int(consts["n_rot"].hi) if consts["n_rot"].hi is not None else 2 * d
    bad = random.randrange(d + 2, top + 1, 2)  # in n_rot's range, past D
    with pytest.raises(DiagnosticError) as exc:
        select_consts(build, regions, {"n_rot": bad})
    text = exc.value.render()
    assert "index '((d + (n_rot / 2)) % n_rot)' of 'pn' reaches" in text
    assert "kernels.fuse:" in text and "Traceback" not in text
    assert "^~~~" in text  # a caret under the index
    assert select_consts(build, regions, {"n_rot": 2 * random.randrange(1, d // 2 + 1)})
    # a region of its own: x[i % N] of x[M] stays inside for N <= M (the three settings the
    # checker tries all have N = M), leaves it for N > M
    result = build_source(GATHER, "gather.fuse")
    out = tmp_path / "g"
    write_build(result, out)
    gathered = Build.load(out)
    m = random.randrange(8, 200)
    assert select_consts(
        gathered, result.program.regions, {"N": m - random.randrange(0, 8), "M": m}
    )
    with pytest.raises(DiagnosticError, match=r"index '\(i % N\)' of 'x' reaches"):
        select_consts(gathered, result.program.regions, {"N": m + random.randrange(1, 9), "M": m})


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_nan_the_reference_computes_is_named_as_such(values_build: tuple[Build, Any]) -> None:
    """sqrt of a negative draw: the reference and both kernels compute NaN there.  The error
    is infinite (NaN is also the poison of an unwritten output), and the message says that the
    reference computes the NaNs, how many, and what --allow-nonfinite does, instead of a bare
    "differs by inf"."""
    build, _ = values_build
    seed = random.randrange(1000)
    args = ["check", str(build.path), "--region", "root", "--seed", str(seed)]
    run = fusec_cli(args, capture_output=True, text=True)
    assert run.returncode == 1 and "Traceback" not in run.stderr
    m = re.fullmatch(
        r"fusec: error: output 'y' of region 'root': the reference itself computes (\d+) NaN "
        r"values from finite inputs \(0 / 0, the root, logarithm or pow of a negative\), so the "
        r"kernels' outputs cannot be measured against it there\n  hint: fix the region, or "
        r"pass --allow-nonfinite to take NaN where the reference has NaN as agreeing\n",
        run.stderr,
    )
    assert m is not None, run.stderr
    assert 0 < int(m.group(1)) < 256  # about half the draws are negative
    run = fusec_cli([*args, "--allow-nonfinite"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stderr == "", run.stderr


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_a_q8_0x_vector_is_not_called_a_weight(build: Build) -> None:
    """Rows that are not whole blocks, of a q8_0x activation: the refusal names it a vector
    (it said "q8_0x weight 'a'", a new-user probe); the GGUF weight beside it is a weight."""
    k = random.choice([n for n in range(33, 1024) if n % 32])
    # an input, and an output of q8_0x blocks too (the output ran, and reported ok, at K = 33)
    for spelled, name, vector in (
        ("matvec_add_q8in<q8_0>", "matvec_add_q8in_q8_0", "a"),
        ("add_rms_norm_q8_0x", "add_rms_norm_q8_0x", "out"),
    ):
        run = _check(build, "--region", spelled, "--const", f"K={k}")
        assert (run.returncode, run.stdout) == (1, "")
        assert run.stderr.startswith(
            f"fusec: error: q8_0x vector '{vector}' of region '{name}' would have rows of "
            f"{k} elements, not a multiple of 32\n"
        ), run.stderr


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_integer_arithmetic_on_input_values_matches_within_u32(
    dev: Device, values_build: tuple[Build, Any]
) -> None:
    """Integer arithmetic on values read from i32 and u32 inputs, where their declared ranges
    keep it within 0 .. 2^32 - 1 (the checker refuses the rest): fused, unfused and the
    reference agree exactly."""
    build, program = values_build
    rep = check_region(dev, build, program.region("intread"), seed=random.randrange(1000))
    assert rep.ok and rep.outputs[0].fused_error == 0.0, rep.outputs


def test_a_run_time_parameter_is_named_as_one() -> None:
    """A u32 `param` given a real: "run-time parameter 'pos'", not "constant" (a new-user
    probe); a constant keeps its word."""
    from fusec.codegen import manifest_records as mr
    from fusec.runtime.dispatch import const_value

    for runtime, word in ((True, "run-time parameter"), (False, "constant")):
        decl = mr.Const("pos", "u32", 0, 0, 100, 0, runtime)
        with pytest.raises(RuntimeFailure) as info:
            const_value(decl, 2.5)
        assert info.value.diagnostics[0].message == (
            f"{word} 'pos' is u32: it must be a whole number, not 2.5"
        )


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_an_argmax_of_nan_values_stays_inside_its_extent(
    dev: Device, values_build: tuple[Build, Any]
) -> None:
    """argmax over values that are all NaN (the root of a negative): no value compares above
    the start, whose index 0xffffffff then read z past its end (a new-user probe).  The index
    is 0, as numpy's, in every product, and the read through it is z[0]."""
    build, program = values_build
    k = random.randint(1, 300)
    rep = check_region(dev, build, program.region("nanmax"), {"K": k}, seed=random.randrange(99))
    assert rep.ok, rep.outputs
