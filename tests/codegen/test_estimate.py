"""The estimator held against ACO through RADV's null device (no AMD GPU needed).

For every kernel of kernels.fuse (fused and unfused) on gfx1201, gfx1151 and navi31, wave32 and
wave64: the estimated demand is within max(4, 10%) of ACO's `Pre-Sched VGPRs` for at least 98%
of kernels, and where it is not, it over-estimates (a refusal on the safe side, never an accepted
spill); the estimated waves per SIMD equal the occupancy computed from ACO's `VGPRs` and `LDS
size` for at least 95%; predicted spills match `Spilled VGPRs` > 0 exactly; LDS is exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fusec.codegen import manifest_records as mr
from fusec.codegen.build import build_file
from fusec.codegen.estimate import scheduled_fewest_waves, whole_workgroup_waves
from fusec.codegen.targets import TARGETS, occupancy
from fusec.runtime.actual import radv_env, run_worker
from tests.conftest import ROOT

pytestmark = [pytest.mark.shaderc, pytest.mark.vulkan]
FAMILIES = ["gfx1201", "gfx1151", "navi31"]


def _compare(built: Path, manifest: mr.Manifest, family: str) -> list[dict[str, Any]]:
    env = radv_env(family)
    if env is None:
        pytest.skip("RADV (mesa-vulkan-drivers) not installed")
    results, why = run_worker(built, [32, 64], env)
    assert results is not None, why
    actual = {(r["kernel"], r["wave"]): r["stats"] for r in results}
    t = TARGETS[family]
    rows = []
    for region in manifest.regions:
        for k in region.fused + region.unfused:
            for est in k.estimates:
                if est.target != family:
                    continue
                st = actual[(k.name, est.wave)]
                rows.append(
                    {
                        "kernel": k.name,
                        "wave": est.wave,
                        "est": est.vgprs,
                        "presched": int(st["Pre-Sched VGPRs"]),
                        "est_waves": est.waves_per_simd,
                        "uncertain": est.uncertain,
                        "aco_waves": occupancy(
                            t,
                            est.wave,
                            int(st["VGPRs"]),
                            int(st["LDS size"]),
                            k.workgroup_size,
                        ),
                        "est_spills": est.spills > 0,
                        "aco_spills": st["Spilled VGPRs"] > 0,
                        "est_lds": est.lds_bytes,
                        "aco_lds": int(st["LDS size"]),
                    }
                )
    return rows


@pytest.mark.parametrize("family", FAMILIES)
def test_estimates_match_aco_for_kernels_fuse(tmp_path: Path, family: str) -> None:
    result = build_file(ROOT / "kernels.fuse", tmp_path / "b", (family,))
    rows = _compare(tmp_path / "b", result.manifest, family)
    assert len(rows) >= 16
    misses = [r for r in rows if abs(r["est"] - r["presched"]) > max(4, 0.10 * r["presched"])]
    assert len(misses) <= 0.02 * len(rows), misses
    # a miss errs on the safe side: more registers than ACO needs, by at most a fifth
    for r in misses:
        assert r["presched"] < r["est"] <= 1.2 * r["presched"], r
    for r in rows:
        assert r["est_spills"] == r["aco_spills"], r
        assert r["est_lds"] == r["aco_lds"], r
    same = sum(r["est_waves"] == r["aco_waves"] for r in rows)
    assert same >= 0.95 * len(rows), [r for r in rows if r["est_waves"] != r["aco_waves"]]


GRID = """
region m_{dt}_{r}_{v}(x: f32[K], W: {dt}[N, K]) -> y: f32[N]
    const K = 4096, N = 4096
    launch workgroup 256, subgroup any, rows_per_subgroup {r}
    y[n] = sum(k: W[n, k] * x[k]) layout n -> subgroup, k -> lane x {v}
"""


def test_contraction_model_beyond_kernels_fuse(tmp_path: Path) -> None:
    """Matvec shapes kernels.fuse does not use, so the model is not fitted to it alone: the
    demand is within tolerance everywhere, and the waves, which ACO's scheduler lowers when it
    moves loads up (Mesa `aco_scheduler.cpp`, `schedule_program`; our `loads_up`), are exact
    for 20 of the 24 kernels.  The four misses are `m_f16_16_16` (both kernels, both waves):
    with every load moved up it would need 290 registers, so we judge it at the aim's bound
    (254: 6 waves in wave32, 3 in wave64); ACO stops short of it, at 8 and 4 waves, since it
    moves each load past at most a few hundred instructions."""
    text = "".join(
        GRID.format(dt=dt, r=r, v=v)
        for dt, r, v in [
            ("f32", 1, 1),
            ("f32", 4, 8),
            ("f32", 16, 16),
            ("f16", 8, 2),
            ("f16", 16, 16),
            ("f32", 8, 4),
        ]
    )
    src = tmp_path / "grid.fuse"
    src.write_text(text)
    result = build_file(src, tmp_path / "b", ("gfx1201",))
    rows = _compare(tmp_path / "b", result.manifest, "gfx1201")
    assert len(rows) == 24  # 6 regions x (fused, unfused.0) x 2 wave sizes
    for r in rows:
        assert abs(r["est"] - r["presched"]) <= max(4, 0.10 * r["presched"]), r
    misses = [r for r in rows if r["est_waves"] != r["aco_waves"]]
    assert len(misses) <= 4, misses
    for r in misses:  # on the safe side: fewer waves than ACO gives
        assert r["est_waves"] < r["aco_waves"], r


def test_whole_workgroups_round_the_waves_down() -> None:
    """ACO's `max_suitable_waves`: the SIMDs of a WGP hold whole workgroups."""
    t = TARGETS["gfx1201"]
    # 512 lanes in wave32 are 16 waves, 4 per SIMD: 10 waves of registers hold 2 groups
    assert whole_workgroup_waves(t, 32, 10, 512) == 8
    assert whole_workgroup_waves(t, 32, 12, 512) == 12
    # 512 lanes in wave64: 3 waves hold one group of 8 waves, 2 per SIMD
    assert whole_workgroup_waves(t, 64, 3, 512) == 2
    # a one-wave workgroup never rounds
    for w in range(1, 17):
        assert whole_workgroup_waves(t, 64, w, 64) == w
    assert whole_workgroup_waves(TARGETS["sm90"], 32, 5, 1024) == 5


def test_scheduler_aims_as_aco_25_0() -> None:
    """ACO's scheduler may raise a kernel's registers to the bound of the occupancy it aims at
    (Mesa 25.0 `schedule_program`).  The figures are those of a probe with many independent
    loads per loop iteration (the scheduler fills its bound), compiled through RADV's null
    device: the driver's VGPRs against the probe's demand."""
    probe = {
        ("gfx1201", 32): {7: 12, 88: 12, 120: 12, 136: 6},
        ("gfx1201", 64): {7: 16, 48: 16, 56: 12, 64: 9, 80: 9, 88: 6, 120: 6, 136: 3},
        ("navi21", 32): {7: 16, 64: 16, 72: 12, 80: 12, 88: 8, 120: 8, 136: 4},
        ("navi21", 64): {7: 16, 24: 16, 32: 10, 48: 10, 56: 8, 64: 8, 72: 6, 88: 4, 136: 2},
    }
    for (name, wave), seen in probe.items():
        t = TARGETS[name]
        for vgprs, waves in seen.items():
            before = occupancy(t, wave, vgprs, 0, 128)
            assert scheduled_fewest_waves(t, wave, vgprs, before, 128, 0) == waves, (
                name,
                wave,
                vgprs,
            )
    # gated__s0_323 of the corpus (seed 0): demand 148, 512 lanes, wave64: ACO allocates 256
    t = TARGETS["gfx1201"]
    assert scheduled_fewest_waves(t, 64, 148, 4, 512, 0) == 2
    for wave in (32, 64):
        for vgprs in range(1, 257, 7):
            for wg in (64, 256, 1024):
                est = occupancy(t, wave, vgprs, 0, wg)
                assert 1 <= scheduled_fewest_waves(t, wave, vgprs, est, wg, 0) <= est


FAR = """#version 450
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;
layout(set = 0, binding = 0, std430) readonly buffer A { float a[]; };
layout(set = 0, binding = 1, std430) writeonly buffer B { float b[]; };
const uint S = 32u;
void main() {
    uint i = gl_LocalInvocationIndex;
    float v[40];
    float s = 0.0;
    [[unroll]] for (uint k = 0u; k < 40u; k++) { v[k] = a[i + S * k] * 2.0; s += v[k]; }
    [[unroll]] for (uint k = 0u; k < 40u; k++) { b[S * k + i] = v[k] / s; }
}
"""


@pytest.mark.shaderc
def test_far_buffer_addresses_used_twice_are_registers() -> None:
    """An address past the buffer instructions' 12-bit offset, shared by a load and a store
    (the same index written two ways), is one VGPR from the load to the store: 32 of the 40
    offsets of 4-byte words at a stride of 32 words fit (< 4096 bytes), 8 do not; at a stride
    of 16 words all fit."""
    from fusec.codegen.liveness import demand
    from fusec.codegen.shaderc import compile_glsl

    far = demand(compile_glsl(FAR, "far.comp"))
    near = demand(compile_glsl(FAR.replace("S = 32u", "S = 16u"), "near.comp"))
    assert far.vgprs - near.vgprs == 8, (far, near)


MIXED_DOT = """
region g_{r}(x: f32[K], g: f32[K], W0: q4_0[F, K], W1: q4_0[F, K]) -> h: f32[F]
    const K = {k}, F = 256, eps = 1e-6
    launch workgroup 128, subgroup any, rows_per_subgroup {r}
    ss = sum(k: x[k] * x[k]) @ workgroup in shared
    xn[k] = x[k] * rsqrt(ss / K + eps) * g[k] in shared as q8_0
    a0[f] = sum(k: W0[f, k] * xn[k]) layout f -> subgroup, k -> lane x 32
    a1[f] = sum(k: W1[f, k] * xn[k]) layout f -> subgroup, k -> lane x 32
    h[f] = max(a0[f], a1[f])
"""


def test_mixed_signedness_dot_products_on_rdna2(tmp_path: Path) -> None:
    """q4_0 weights against q8_0 activations take OpSUDot, which RDNA2 lacks
    (codegen/liveness.py rule 13): on navi21 the demand is the one with the shared signed
    operand unpacked, and it is within tolerance of ACO's Pre-Sched there; gfx1201 keeps the
    plain demand."""
    import random

    k = random.choice([1024, 2048, 4096])
    text = "".join(MIXED_DOT.format(r=r, k=k) for r in (4, 8))
    src = tmp_path / "mixed.fuse"
    src.write_text(text)
    result = build_file(src, tmp_path / "b", ("navi21", "gfx1201"))
    fused = {b.kernel.name: b.demand for b in result.kernels if "." not in b.kernel.name}
    assert len(fused) == 2
    for d in fused.values():
        assert d is not None and d.unpacked_dot >= d.vgprs + 8, d
    rows = _compare(tmp_path / "b", result.manifest, "navi21")
    for r in rows:
        assert abs(r["est"] - r["presched"]) <= max(4, 0.10 * r["presched"]), r
    assert len(rows) == 24  # 2 regions x (fused, 5 unfused) x 2 wave sizes
    same = sum(r["est_waves"] == r["aco_waves"] for r in rows)
    assert same >= 20, [r for r in rows if r["est_waves"] != r["aco_waves"]]
    for region in result.manifest.regions:
        for kern in region.fused:
            est = {(e.target, e.wave): e for e in kern.estimates}
            demand = fused[kern.name]
            assert demand is not None
            assert est[("gfx1201", 32)].vgprs == demand.vgprs
            assert est[("navi21", 32)].vgprs == demand.unpacked_dot
