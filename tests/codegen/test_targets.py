"""The occupancy model against the data points FACTS.md records for RADV/ACO and Hopper."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from fusec.codegen.targets import TARGETS, occupancy, spill_limit, target_for_device


def test_rdna4_points_from_the_null_device() -> None:
    t = TARGETS["gfx1201"]
    # a matvec with demand 17 reports 96 VGPRs in wave32: 1536 / 96 = 16 waves, nothing lost
    assert occupancy(t, 32, 96, 0, 256) == 16
    assert occupancy(t, 32, 17, 0, 256) == 16
    # demand 17 with 16.9 KiB of LDS per 256-thread workgroup: 7 waves in wave64 (ACO: 108)
    assert occupancy(t, 64, 17, 17300, 256) == 7
    assert occupancy(t, 64, 108, 17300, 256) == 7
    # at 300 live floats ACO spills: the limit is 256 in both wave sizes
    assert spill_limit(t, 32, 256) == 256 and spill_limit(t, 64, 256) == 256


def test_rdna2_has_the_smaller_file() -> None:
    assert occupancy(TARGETS["navi21"], 32, 64, 0, 256) == 16
    assert occupancy(TARGETS["navi21"], 32, 128, 0, 256) == 8
    assert occupancy(TARGETS["gfx1151"], 32, 128, 0, 256) == 10  # 128 -> allocation 144


def test_hopper_formula() -> None:
    t = TARGETS["sm90"]
    # 32 registers, 256 threads: 8 blocks of 8 warps = 64 warps per SM = 16 per scheduler
    assert occupancy(t, 32, 32, 0, 256) == 16
    # 128 registers: 65536 / 4096 = 16 warps per SM -> 4 per scheduler
    assert occupancy(t, 32, 128, 0, 256) == 4


def test_device_names_map_to_targets() -> None:
    assert target_for_device("NVIDIA H200").name == "sm90"  # type: ignore[union-attr]
    assert target_for_device("Null hardware (RADV GFX1201)").name == "gfx1201"  # type: ignore[union-attr]
    assert target_for_device("llvmpipe (LLVM 15.0.6, 256 bits)") is None


@settings(max_examples=200, derandomize=True)
@given(
    target=st.sampled_from(sorted(TARGETS)),
    vgprs=st.integers(1, 255),
    extra=st.integers(1, 64),
    lds=st.integers(0, 49152),
    wg=st.sampled_from([32, 64, 128, 256, 512, 1024]),
)
def test_more_live_values_never_mean_more_waves(
    target: str, vgprs: int, extra: int, lds: int, wg: int
) -> None:
    t = TARGETS[target]
    for wave in t.wave_sizes:
        more = min(vgprs + extra, t.max_vgprs)
        assert occupancy(t, wave, more, lds, wg) <= occupancy(t, wave, vgprs, lds, wg)
        assert occupancy(t, wave, vgprs, lds + 1024, wg) <= occupancy(t, wave, vgprs, lds, wg)
