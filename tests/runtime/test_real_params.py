"""Real-valued run-time parameters on lavapipe (tests/data/real_params.fuse: a sampling head
with a run-time temperature, a soft-capped LM head with a run-time cap beside an integer `pos`):
one recorded command buffer is replayed at several values set between submissions, with no
pipeline created in between, fused and unfused, every output against the numpy reference;
`fusec check` runs a real param at its low end, middle and high end at subgroup sizes 4, 8 and
16, takes `--const temp=...` and refuses a value outside its range or not finite; the C engine
of `fusec export --c-header` sets the param from the header's description; a manifest whose
real param's record is damaged is refused."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.codegen import manifest as mf
from fusec.codegen.build import build_source, write_build
from fusec.dsl import ir
from fusec.dsl.reference import run_reference
from fusec.runtime import dispatch
from fusec.runtime.device import Device, RuntimeFailure
from fusec.runtime.dispatch import Build, RegionRunner, begin_commands, const_values, submit
from fusec.runtime.param_words import param_words
from fusec.runtime.verify import (
    f32_inside,
    param_points,
    random_inputs,
    relative_error,
    tolerance_for,
)
from tests.conftest import check_on_lavapipe, fusec_cli

pytestmark = pytest.mark.shaderc

SOURCE = Path(__file__).parents[1] / "data" / "real_params.fuse"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[ir.Program, Path]:
    result = build_source(SOURCE.read_text(), str(SOURCE))
    return result.program, write_build(result, tmp_path_factory.mktemp("real") / "b")


def test_param_words_hold_a_u32_value_and_an_f32_bit_pattern(
    built: tuple[ir.Program, Path],
) -> None:
    region = Build.load(built[1]).region("softcap_rt")
    words = param_words(region.params(), {"cap": 7.3, "pos": 123})
    assert [c.name for c in region.params()] == ["cap", "pos"]
    assert words.dtype == np.uint32
    assert words.view(np.float32)[0] == np.float32(7.3) and words[1] == 123


def test_check_runs_a_real_param_at_its_low_end_middle_and_high_end(
    built: tuple[ir.Program, Path],
) -> None:
    program, folder = built
    build = Build.load(folder)
    temp = param_points(build, program.region("sample_temp"), {"V": 1003})
    assert [p["temp"] for p in temp] == [0.25, 1.125, 2.0]
    both = param_points(build, program.region("softcap_rt"), {"K": 129, "V": 301})
    assert [(p["cap"], p["pos"]) for p in both] == [(5.0, 0), (5.0, 1), (27.5, 150), (50.0, 300)]
    # values as the kernels read them: f32, inside the declared range
    odd = param_points(build, program.region("sample_temp"), {"V": 1003})
    assert all(float(np.float32(p["temp"])) == p["temp"] for p in odd)


def test_a_point_is_the_f32_nearest_it_inside_the_range() -> None:
    # 0.1 and 0.3 round up as f32: at the high end the point steps down to stay inside
    hi = f32_inside(0.3, 0.1, 0.3)
    assert hi <= 0.3 and float(np.float32(hi)) == hi and 0.3 - hi < 1e-7
    lo = f32_inside(0.1, 0.1, 0.3)
    assert lo >= 0.1 and float(np.float32(lo)) == lo and lo - 0.1 < 1e-8
    # 0.7 rounds down as f32: at the low end the point steps up
    up = f32_inside(0.7, 0.7, 0.9)
    assert up >= 0.7 and float(np.float32(up)) == up and up - 0.7 < 1e-7
    assert f32_inside(-1.5, -2.0, 3.0) == -1.5


def _record_once(runner: RegionRunner, dev: Device, fused: bool) -> tuple[Any, str]:
    path, kernels = runner.choose(fused)
    pipelines, sizes = runner.pipelines_for(kernels)
    runner._pipelines.extend(pipelines)  # destroyed with the runner
    cmd = begin_commands(dev)
    runner.record(cmd, kernels, pipelines, sizes)
    dev.vk.vkEndCommandBuffer(cmd)
    return cmd, path


@pytest.mark.vulkan
@pytest.mark.parametrize(
    ("name", "param", "values"),
    [
        ("softcap_rt", "cap", [5.0, 7.3, 31.7, 50.0]),
        ("sample_temp", "temp", [0.25, 0.61, 1.37, 2.0]),
    ],
)
def test_one_recording_replayed_at_new_values_matches_the_reference(
    dev: Device,
    built: tuple[ir.Program, Path],
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    param: str,
    values: list[float],
) -> None:
    program, folder = built
    build = Build.load(folder)
    region = build.region(name)
    rng = np.random.default_rng()
    consts = const_values(region, {})
    inputs = random_inputs(region, consts, rng)
    tol = tolerance_for(region)[1]
    created: list[Any] = []
    real_pipeline = dispatch.Pipeline

    def counted(*args: Any, **kwargs: Any) -> Any:
        created.append(args)
        return real_pipeline(*args, **kwargs)

    monkeypatch.setattr(dispatch, "Pipeline", counted)
    for fused in (True, False):
        runner = RegionRunner(dev, build, name, consts)
        try:
            runner.prepare(inputs)
            cmd, path = _record_once(runner, dev, fused)
            assert path == ("fused" if fused else "unfused")
            before = len(created)
            assert before > 0
            for v in values:
                point = {param: v}
                if "pos" in consts:
                    point["pos"] = int(rng.integers(0, consts["V"]))
                runner.set_params(point)
                runner.prepare(inputs)  # fresh NaN in every output
                submit(dev, cmd)
                assert len(created) == before, "a new value must not create a pipeline"
                ref = run_reference(program.region(name), inputs, {**consts, **point})
                for b in region.outputs:
                    got = runner.buffer(b.name).download(np.float32, ref[b.name].shape)
                    assert np.all(np.isfinite(got)), (name, fused, v)
                    err = relative_error(got, ref[b.name])
                    assert err <= tol, (name, fused, point, err)
            dev.vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cmd])
        finally:
            runner.close()


@pytest.mark.vulkan
@pytest.mark.parametrize(("width", "subgroup"), [(128, 4), (256, 8), (512, 16)])
def test_fusec_check_at_lavapipe_subgroup_sizes(
    root: Path, built: tuple[ir.Program, Path], width: int, subgroup: int
) -> None:
    args = [str(built[1])]
    if subgroup == 8:  # one run at a value set by hand instead of the points
        args += ["--const", "temp=0.7"]
    out = check_on_lavapipe(args, width, subgroup)
    assert out.count(" ok\n") == 2
    assert "softcap_rt: run-time params checked at cap=5, pos=0; " in out
    if subgroup == 8:
        assert "sample_temp [V=1003, temp=0.7]: fused;" in out
    else:
        assert "sample_temp: run-time params checked at temp=0.25; temp=1.125; temp=2;" in out


@pytest.mark.vulkan
@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("3.5", "outside its range 0.25 .. 2.0"),
        ("nan", "must be a finite number"),
        ("inf", "must be a finite number"),
    ],
)
def test_check_refuses_a_value_outside_the_range_or_not_finite(
    root: Path, built: tuple[ir.Program, Path], value: str, why: str
) -> None:
    proc = fusec_cli(
        ["check", str(built[1]), "--region", "sample_temp", "--const", f"temp={value}"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("fusec: error: ") and why in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_the_c_header_describes_a_real_param(
    built: tuple[ir.Program, Path], tmp_path: Path
) -> None:
    header = tmp_path / "fusec_kernels.h"
    proc = fusec_cli(
        ["export", str(built[1]), "--c-header", str(header), "--region", "softcap_rt"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    text = header.read_text()
    # name, dtype, slot, run-time, default (5.0f's bits), has_min, has_max, min, max
    assert '{"cap", FUSEC_DTYPE_F32, 0u, 1, {0x40a00000u} /* 5.0f */, 1, 1, 5.0, 50.0},' in text
    assert '{"pos", FUSEC_DTYPE_U32, 1u, 1, {0u}, 1, 1, 0.0, 300.0},' in text
    assert "an f32 param's bits" in text


@pytest.mark.vulkan
def test_the_c_engine_sets_a_real_param_from_the_header(
    built: tuple[ir.Program, Path], tmp_path: Path
) -> None:
    """examples/engine_c writes `-c cap=7.3` into the params buffer as the header describes it
    (the f32's bits); fused and unfused outputs match the numpy reference at that value."""
    from tests.runtime.test_export import compile_engine, run_engine

    program, folder = built
    proc = fusec_cli(
        ["export", str(folder), "--c-header", str(tmp_path / "fusec_kernels.h")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    exe = compile_engine(tmp_path, tmp_path / "engine", "softcap_rt")
    region = Build.load(folder).region("softcap_rt")
    consts = const_values(region, {})
    inputs = random_inputs(region, consts, np.random.default_rng())
    pos = int(np.random.default_rng().integers(100, 300))
    at = {"cap": 7.3, "pos": pos}
    ref = run_reference(program.region("softcap_rt"), inputs, {**consts, **at})["y"]
    for options in ([], ["--unfused"]):
        cs = ["-c", "cap=7.3", "-c", f"pos={pos}"]
        out, got = run_engine(exe, region, inputs, tmp_path, *options, *cs)
        assert ("unfused;" if options else "fused;") in out, out
        assert relative_error(got["y"], ref) <= tolerance_for(region)[1]


def _damaged(folder: Path, dest: Path, name: str, field: str, value: Any) -> Path:
    """A resealed copy of the build whose param `name` has `field` set to `value`."""
    shutil.copytree(folder, dest)
    data = json.loads((dest / "manifest.json").read_text())
    for region in data["regions"]:
        for c in region["consts"]:
            if c["name"] == name:
                c[field] = value
    (dest / "manifest.json").write_text(json.dumps(mf.seal(data), indent=1))
    return dest


@pytest.mark.parametrize(
    ("name", "field", "value", "why"),
    [
        ("temp", "dtype", "i32", "run-time parameter 'temp' is i32, not u32 or f32"),
        ("pos", "dtype", "i32", "run-time parameter 'pos' is i32, not u32 or f32"),
        ("temp", "dtype", "u32", "constant 'temp' is u32 but its default is 0.25"),
        ("temp", "dtype", 7, "is invalid"),
        ("temp", "default", "0.25", "is invalid"),
        ("cap", "max", [50.0], "is invalid"),
    ],
)
def test_a_damaged_real_param_record_is_refused(
    built: tuple[ir.Program, Path], tmp_path: Path, name: str, field: str, value: Any, why: str
) -> None:
    with pytest.raises(RuntimeFailure) as info:
        Build.load(_damaged(built[1], tmp_path / "d", name, field, value))
    [diag] = info.value.diagnostics
    assert why in diag.message and "\n" not in diag.message, diag.message


def test_accepts_a_real_param_in_fusec_explain(root: Path) -> None:
    proc = fusec_cli(
        ["explain", str(SOURCE), "--region", "sample_temp", "--target", "gfx1201"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    assert "region sample_temp" in proc.stdout and "runs fused" in proc.stdout


@pytest.mark.vulkan
@pytest.mark.parametrize("fused", [True, False])
def test_a_recording_after_new_values_keeps_every_constant(
    dev: Device, built: tuple[ir.Program, Path], fused: bool
) -> None:
    """Constants away from their defaults survive `set_params`, and a command buffer recorded
    after it is sized from them: V = 700 rows where the default is 301, so a grid sized at the
    defaults would leave rows 301..699 as the NaN `prepare` wrote (the H200 layer's timed steps
    dispatched half of the attention split's workgroups this way)."""
    program, folder = built
    build = Build.load(folder)
    region = build.region("softcap_rt")
    rng = np.random.default_rng()
    consts = const_values(region, {"K": int(rng.integers(150, 400)), "V": 700})
    assert consts["V"] > region.const("V").default
    inputs = random_inputs(region, consts, rng)
    runner = RegionRunner(dev, build, "softcap_rt", consts)
    try:
        point = {"cap": float(np.float32(rng.uniform(6.0, 40.0))), "pos": int(rng.integers(0, 300))}
        runner.set_params(point)
        assert {k: runner.consts[k] for k in ("K", "V")} == {k: consts[k] for k in ("K", "V")}
        runner.prepare(inputs)  # NaN in every output
        cmd, path = _record_once(runner, dev, fused)
        assert path == ("fused" if fused else "unfused")
        submit(dev, cmd)
        ref = run_reference(program.region("softcap_rt"), inputs, {**consts, **point})
        got = runner.buffer("y").download(np.float32, ref["y"].shape)
        assert np.all(np.isfinite(got)), np.flatnonzero(~np.isfinite(got))[:5]
        assert relative_error(got, ref["y"]) <= tolerance_for(region)[1]
        dev.vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cmd])
    finally:
        runner.close()


TILE_PARAMS = """\
region tp(m: f32[T, 4]) -> C: f32[T, 4]
    const T = 5 in 1 .. 10
    param p in 0 .. 3, s in 0.5 .. 2.0
    launch workgroup 64, subgroup >= 4 else shared
    tile (i: 4) lane i, per t
    c = m[t, i] * float(p) + shuffle_xor(m[t, i], 1) * s
    C[t, i] = c
"""


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_a_param_in_a_tile_region(tmp_path: Path) -> None:
    """A run-time parameter read in a tile region: its kernels bind the params buffer (they did
    not, and the GLSL compiler's "'c_p' : undeclared identifier" came back at 1:1; found by a
    new-user probe).  fusec check runs it at several points of both params and every product
    matches the reference."""
    src = tmp_path / "tp.fuse"
    src.write_text(TILE_PARAMS)
    seed = str(random.randrange(1000))
    run = fusec_cli(["check", str(src), "--seed", seed], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[1].startswith("tp: run-time params checked at p=0, s=0.5; ")
    assert "C: max rel err" in run.stdout and run.stdout.rstrip().endswith(" ok")


@pytest.mark.shaderc
def test_check_does_not_step_around_a_param_value_that_leaves_an_output_unwritten(
    tmp_path: Path,
) -> None:
    """Masks on a param that leave the output unwritten for values inside its range: check
    moved its middle point off such a value and reported ok (a new-user probe); it now refuses
    at that value, at the stage, as `--const` does."""
    a, b = random.randint(10, 49), random.randint(51, 90)
    src = tmp_path / "pm.fuse"
    src.write_text(
        "region pm(x: f32[D]) -> y: f32[D]\n"
        "    const D = 16 in 1 .. 64\n"
        "    param pos in 0 .. 100\n"
        "    launch workgroup 64\n"
        f"    y[d] = x[d] * 2.0  where pos < {a}\n"
        f"    y[d] = x[d] + 1.0  where pos > {b}\n"
    )
    run = fusec_cli(["check", str(src)], capture_output=True, text=True)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith(
        f"{src}:5:5: error: in region 'pm' at D=16, pos=50, 16 element(s) of 'y' are never written"
    ), run.stderr
