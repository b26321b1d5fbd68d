"""`fusec tune` without the target's hardware: rank candidates by the estimator and ACO.

Input: the candidates (runtime/tune_build.py), already within the target's budget, with the
fused kernels' estimates at the wave the target's driver picks, and each contraction's weight
dtype.  Output: `Ranked` records, best first, each with the numbers it was ranked by and one
line of reasoning ("waves 16 at 48 VGPRs (ACO: 16 at 40); 8 rows per workgroup; ...").

Where RADV is installed, each candidate's fused kernels are also compiled by ACO through the
null device (runtime/actual.py, `RADV_FORCE_FAMILY`), and the driver's allocation and occupancy
replace the estimate's; the reasoning shows both.

The model (a decode region streams its weights once; its speed is how many weight bytes are in
flight): per lane and step a contraction loads `rows x vector x bytes per element` of weights
(rows: `rows_per_subgroup` for `n -> subgroup`, 1 for `n -> workgroup`), and a SIMD holds
`waves x wave size` lanes.  Candidates are ranked by those bytes in flight per SIMD, up to what
hides the memory latency (`IN_FLIGHT_BYTES`; beyond it more only costs registers), then by
waves per SIMD, then by fewer VGPRs, then the baseline first.  This is a model, not a
measurement: the ranking says so wherever it is printed.

Not done here: judging the budget (tune_build.py), timing (tune_time.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction

import attrs

from fusec.codegen.targets import Target

from .tune_build import Candidate

# Weight bytes per element by dtype (block size / elements per block for the GGUF types).
ELEMENT_BYTES: dict[str, Fraction] = {
    "f32": Fraction(4),
    "f16": Fraction(2),
    "q8_0": Fraction(34, 32),
    "q4_0": Fraction(18, 32),
    "q4_K": Fraction(144, 256),
    "q6_K": Fraction(210, 256),
}
# Bytes in flight per SIMD that hide DRAM latency, by vendor.  Little's law with round
# figures: RDNA4 (gfx1201) 640 GB/s x ~1 us latency over 128 SIMDs is 5 KB; Hopper 4.8 TB/s x
# ~0.8 us over 528 schedulers is 7 KB.  8 KiB covers both; a per-target knob belongs on
# `Target` once codegen/targets.py grows one (issue 18, item 3).
IN_FLIGHT_BYTES = 8192


@attrs.frozen
class Ranked:
    candidate: Candidate
    waves: int  # per SIMD, the driver's where it gave numbers, else the estimate's
    vgprs: int
    rows_per_workgroup: int
    lane_bytes: float  # weight bytes per lane per step, summed over the contractions
    in_flight: float  # lane_bytes x lanes per SIMD
    actual: tuple[int, int] | None  # (waves, VGPRs allocated) from ACO
    reasoning: str

    def key(self) -> tuple[float, int, int, int]:
        return (
            -min(self.in_flight, IN_FLIGHT_BYTES),
            -self.waves,
            self.vgprs,
            0 if self.candidate.baseline else 1,
        )


def aco_numbers(target: Target, candidate: Candidate) -> tuple[tuple[int, int] | None, str | None]:
    """((fewest waves, most VGPRs allocated) over the fused kernels, from ACO through the RADV
    null device, or None; why there are none)."""
    from .actual import radv_env, run_worker
    from .gate import driver_numbers

    if target.vendor != "amd":
        return None, f"ACO compiles for AMD targets only, not {target.name}"
    env = radv_env(target.name)
    if env is None:
        return None, "RADV (mesa-vulkan-drivers) is not installed"
    assert candidate.wave is not None
    region = candidate.build.manifest.regions[0]
    names = [k.name for k in region.fused]
    results, why = run_worker(candidate.build.path, [candidate.wave], env, names)
    if results is None:
        return None, why
    waves, vgprs = [], []
    for k in region.fused:
        st = next((r["stats"] for r in results if r["kernel"] == k.name and "stats" in r), None)
        numbers = (
            None if st is None else driver_numbers(target, candidate.wave, st, k.workgroup_size)
        )
        if numbers is None:
            return None, f"no statistics for {k.name}"
        waves.append(numbers[0].waves_per_simd)
        vgprs.append(numbers[1])
    return (min(waves), max(vgprs)), None


def rank_candidates(
    target: Target,
    candidates: Sequence[Candidate],
    weight_dtypes: Mapping[str, str],
    actual: bool,
    note: Callable[[str], None],
    advance: Callable[[], None] = lambda: None,
) -> list[Ranked]:
    """The candidates best first; `actual`: ask ACO too (one worker process per candidate)."""
    out = []
    told = False
    for c in candidates:
        assert c.wave is not None and c.estimates
        wave = c.wave
        waves = min(e.waves_per_simd for _, e in c.estimates)
        vgprs = max(e.vgprs for _, e in c.estimates)
        got = None
        if actual:
            got, why = aco_numbers(target, c)
            if got is None and not told:
                note(f"no ACO statistics for {target.name}: {why}; ranking by the estimate")
                told = True
        s = c.schedule
        subgroups = max(1, s.workgroup // wave)
        rows = s.rows_per_subgroup or 1
        lane_bytes = Fraction(0)
        rows_per_wg = 0
        parts = []
        for lay in s.layouts:
            per_lane_rows = rows if lay.rows == "subgroup" else 1
            dtype = weight_dtypes.get(lay.stage, "f32")
            lane_bytes += per_lane_rows * lay.vector * ELEMENT_BYTES.get(dtype, Fraction(4))
            rows_per_wg = max(rows_per_wg, subgroups * rows if lay.rows == "subgroup" else 1)
            parts.append(f"{lay.stage}: {lay.vector} {dtype} per lane x {per_lane_rows} row(s)")
        use_waves, use_vgprs = got if got is not None else (waves, vgprs)
        in_flight = float(lane_bytes) * use_waves * wave
        estimate = f"waves {waves} at {vgprs} VGPRs (estimate, wave{wave})"
        if got is not None:
            estimate += f", ACO: waves {got[0]} at {got[1]} VGPRs allocated"
        reasoning = "; ".join(
            [
                estimate,
                f"{rows_per_wg or s.workgroup // wave} rows per workgroup of {s.workgroup}",
                *parts,
                f"{float(lane_bytes):g} B per lane per step, {in_flight:,.0f} B in flight per "
                f"SIMD (enough: {IN_FLIGHT_BYTES:,})",
            ]
        )
        out.append(
            Ranked(
                c,
                use_waves,
                use_vgprs,
                rows_per_wg,
                float(lane_bytes),
                in_flight,
                got,
                reasoning,
            )
        )
        advance()
    return sorted(out, key=Ranked.key)
