"""Per-target capabilities (codegen/targets.py) and the gate's refusal of a fused kernel that
needs one its target lacks: at build time (manifest verdicts), in `fusec occupancy`, in the
runtime gate on a named target, and against the driver: every fused kernel of kernels.fuse that
the gate accepts for navi21 compiles on RADV's null device forced to navi21 (ACO aborts the
process on a float atomic add there, FACTS.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fusec.codegen import manifest_records as mr
from fusec.codegen.budget import capability_refusal
from fusec.codegen.targets import ATOMIC_FLOAT_ADD, FEATURES, TARGETS
from fusec.runtime.cli import main

SPLITK_ON_NAVI21 = (
    "navi21: gated_ffn_down_splitk: needs float atomic add on buffers, which RDNA2 lacks"
)


def _kernel(**over: Any) -> mr.Kernel:
    k: dict[str, Any] = {
        "name": "k",
        "spv": "k.spv",
        "sha256": "0" * 64,
        "stages": ["s"],
        "workgroup_size": 256,
        "subgroup": {"kind": "any", "sizes": []},
        "bindings": [{"binding": 0, "buffer": "x", "reads": True, "writes": True}],
        "shared_floats": [],
        "reduction_scratch": False,
        "exchange_scratch": False,
        "grid": [],
        "features": [],
        "zero_outputs": [],
        "derived": [],
        "estimates": [],
        "loop": None,
        "loop_count": None,
        "exchange": None,
    }
    return mr.Kernel.from_json({**k, **over})


def test_capability_table() -> None:
    """What RADV's null device (Mesa 25.0.7) and the NVIDIA driver report (sources in
    targets.py): only RDNA2 lacks float atomic add on buffers."""
    every = frozenset(FEATURES)
    for name in ("gfx1201", "gfx1200", "gfx1151", "navi31", "sm90"):
        assert TARGETS[name].features == every, name
    assert TARGETS["navi21"].features == every - {ATOMIC_FLOAT_ADD}
    for name, t in TARGETS.items():
        assert t.wave_sizes == ((32,) if name == "sm90" else (32, 64))
        assert t.max_shared_bytes == (49152 if name == "sm90" else 65536)
        assert t.size_control and t.max_workgroup_size == 1024
    assert [TARGETS[n].arch for n in TARGETS] == [
        "RDNA4",
        "RDNA4",
        "RDNA3.5",
        "RDNA3",
        "RDNA2",
        "Hopper",
    ]


def test_capability_refusal_names_the_capability() -> None:
    navi21, gfx1201, sm90 = TARGETS["navi21"], TARGETS["gfx1201"], TARGETS["sm90"]
    atomic = _kernel(features=["storage_buffer_16bit", "atomic_float_add"])
    assert capability_refusal(navi21, atomic, 0) == (
        "needs float atomic add on buffers, which RDNA2 lacks"
    )
    assert capability_refusal(gfx1201, atomic, 0) is None
    assert capability_refusal(sm90, atomic, 0) is None
    sixteen = _kernel(subgroup={"kind": "choice", "sizes": [16]})
    assert capability_refusal(gfx1201, sixteen, 0) == (
        "needs subgroup size 16, which RDNA4 lacks (32/64)"
    )
    wide = _kernel(subgroup={"kind": "at_least", "sizes": [64]})
    assert capability_refusal(sm90, wide, 0) == (
        "needs subgroup size >= 64, which Hopper lacks (32)"
    )
    assert capability_refusal(gfx1201, wide, 0) is None
    assert capability_refusal(gfx1201, wide, 0, wave=32) == "needs subgroup size >= 64, not 32"
    assert capability_refusal(sm90, _kernel(), 49153) == (
        "needs 49153 bytes of shared memory per workgroup, Hopper allows 49152"
    )
    assert capability_refusal(gfx1201, _kernel(), 49153) is None
    assert capability_refusal(gfx1201, _kernel(workgroup_size=2048), 0) == (
        "needs a workgroup of 2048, RDNA4 allows 1024"
    )
    # a workgroup smaller than the subgroup: what the runtime's device check refuses
    for size in (1, 4, 16, 31):
        small = _kernel(workgroup_size=size)
        for t, wave, sub, family in ((sm90, None, 32, "Hopper"), (gfx1201, 64, 64, "RDNA4")):
            assert capability_refusal(t, small, 0, wave=wave) == (
                f"its workgroup of {size} is smaller than a subgroup of {sub}, "
                f"the least {family} runs it with"
            )
    assert capability_refusal(gfx1201, _kernel(workgroup_size=32), 0, wave=32) is None
    assert capability_refusal(gfx1201, _kernel(workgroup_size=32), 0, wave=64) is not None


def test_subgroup_rule_matches_the_checker() -> None:
    from fusec.dsl.ir import SubgroupReq

    for kind, sizes in [("any", ()), ("at_least", (16,)), ("choice", (32, 64)), ("choice", (8,))]:
        req = SubgroupReq(kind, sizes)
        for size in (4, 8, 16, 32, 64, 128):
            assert mr.Subgroup(kind, sizes).allows(size) == req.allows(size)


@pytest.mark.shaderc
def test_verdicts_refuse_splitk_on_navi21(build: Any) -> None:
    """The manifest's verdicts: the split-K fused kernel is refused on navi21 in both wave
    sizes, for its float atomic add, and accepted where the capability exists."""
    regions = {r.name: r for r in build.manifest.regions}
    verdicts = regions["gated_ffn_down_splitk"].to_json()["verdicts"]
    assert verdicts["navi21"] == {
        "32": {"accepted": False, "reason": SPLITK_ON_NAVI21},
        "64": {"accepted": False, "reason": SPLITK_ON_NAVI21},
    }
    for target in ("gfx1201", "gfx1151", "navi31", "sm90"):
        assert all(v["accepted"] for v in verdicts[target].values()), target
    for name, region in regions.items():
        for v in region.verdicts:
            if name != "gated_ffn_down_splitk":
                assert "lacks" not in v.reason, (name, v)


@pytest.mark.shaderc
def test_occupancy_shows_the_refusal_on_navi21(
    build: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["occupancy", str(build.path), "--target", "navi21", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    splitk = [r for r in rows if r["region"] == "gated_ffn_down_splitk"]
    fused = [r for r in splitk if r["kernel"] == "fused"]
    assert [(r["wave"], r["accepted"], r["reason"]) for r in fused] == [
        (32, False, SPLITK_ON_NAVI21),
        (64, False, SPLITK_ON_NAVI21),
    ]
    # its unfused chain needs no float atomics
    assert all(r["accepted"] for r in splitk if r["kernel"] != "fused")
    assert main(["occupancy", str(build.path), "--target", "navi21"]) == 0
    table = capsys.readouterr().out
    assert "(estimated)" in table.splitlines()[0]
    # the reason column folds long reasons: join the table's cells back together
    cells = "".join(
        line.split("│")[-2].strip() for line in table.splitlines() if line.count("│") > 2
    )
    assert SPLITK_ON_NAVI21.replace(" ", "") in cells.replace(" ", "")


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_runtime_gate_refuses_on_a_named_target(build: Any, dev: Any) -> None:
    """`fusec check --target navi21` on any device: the named target's capabilities gate the
    fused product before a pipeline exists."""
    from fusec.runtime.dispatch import RegionRunner

    runner = RegionRunner(dev, build, "gated_ffn_down_splitk", {"H": 64, "F": 32}, "navi21")
    try:
        path, kernels = runner.choose(True)
    finally:
        runner.close()
    assert path == f"fallback(capability: {SPLITK_ON_NAVI21})"
    assert [k.name for k in kernels] == [f"gated_ffn_down_splitk.unfused.{i}" for i in range(4)]
    accepted = RegionRunner(dev, build, "gated_ffn_down_splitk", {"H": 64, "F": 32}, "gfx1201")
    try:
        assert not accepted.choose(True)[0].startswith("fallback(capability")
    finally:
        accepted.close()


def _radv_or_skip(family: str) -> dict[str, str]:
    from fusec.runtime.actual import radv_env

    env = radv_env(family)
    if env is None:
        pytest.skip("RADV (mesa-vulkan-drivers) is not installed")
    return env


@pytest.mark.slow
@pytest.mark.shaderc
def test_every_accepted_fused_kernel_compiles_on_navi21(build: Any) -> None:
    """The gate is enough: each fused kernel of kernels.fuse whose verdict accepts navi21 (in
    either wave size) is compiled by ACO for navi21 in wave32 and wave64, in a child process
    (an unsupported opcode aborts it), and none is withheld for a missing feature."""
    from fusec.runtime.actual import run_worker

    env = _radv_or_skip("navi21")
    accepted = [
        k.name
        for r in build.manifest.regions
        if any(v.accepted for v in r.verdicts if v.target == "navi21")
        for k in r.fused + r.fused_shared
    ]
    assert "gated_ffn_down_splitk" not in accepted and len(accepted) >= 25
    results, why = run_worker(build.path, [32, 64], env, only=accepted)
    assert results is not None, why
    assert {r["device"] for r in results} == {"Null hardware (RADV NAVI21)"}
    assert [r for r in results if "refused" in r] == []
    compiled = {(r["kernel"], r["wave"]) for r in results if "VGPRs" in r["stats"]}
    assert compiled == {(k, w) for k in accepted for w in (32, 64)}


@pytest.mark.slow
@pytest.mark.shaderc
def test_statistics_worker_withholds_what_navi21_cannot_compile(build: Any) -> None:
    """`fusec occupancy --actual` on navi21 reports the split-K kernel as not compiled instead of
    losing every statistic to ACO's abort."""
    from fusec.runtime.actual import run_worker

    env = _radv_or_skip("navi21")
    results, why = run_worker(build.path, [64], env, only=["gated_ffn_down_splitk"])
    assert results == [
        {
            "region": "gated_ffn_down_splitk",
            "kernel": "gated_ffn_down_splitk",
            "device": "Null hardware (RADV NAVI21)",
            "refused": "device lacks shaderBufferFloat32AtomicAdd",
        }
    ], why
