"""codegen/nvidia.py held against the H200: NVIDIA's `Register Count` of the kernels of four
collections (kernels.fuse and 120 corpus regions each; seeds 7, 23, 31 and 41), committed with the
features of their SPIR-V (tests/estimator/data/sm90/h200*.json, written by `bench/estimator_sm90.py
report --json`), and a few of those SPIR-V modules, so that neither the rules nor the analysis they
read drift without a test failing.  No GPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fusec.codegen.liveness import demand
from fusec.codegen.nvidia import (
    RULES,
    NvidiaFeatures,
    NvidiaRules,
    analyze_nvidia,
    estimate_nvidia_registers,
)
from fusec.codegen.nvidia_schedule import least_order
from fusec.codegen.targets import TARGETS, occupancy

DATA = Path(__file__).parent / "data" / "sm90"
SM90 = TARGETS["sm90"]


def _rows(name: str = "h200.json") -> tuple[list[str], list[dict[str, Any]]]:
    doc = json.loads((DATA / name).read_text())
    return doc["developed_on"], doc["rows"]


def _warps(regs: int, row: dict[str, Any]) -> int:
    return occupancy(SM90, 32, min(regs, SM90.max_vgprs), row["lds"], row["workgroup"])


def _agreement(rows: list[dict[str, Any]], rules: NvidiaRules = RULES) -> tuple[int, int]:
    warps = spills = 0
    for r in rows:
        est = estimate_nvidia_registers(NvidiaFeatures(**r["features"]), rules)
        warps += _warps(est, r) == _warps(r["register_count"], r)
        spills += (est > SM90.max_vgprs) == (r["local"] > 0)
    return warps, spills


def test_warps_per_scheduler_against_the_h200() -> None:
    developed_on, rows = _rows()
    dev = [r for r in rows if r["set"] in developed_on]
    held = [r for r in rows if r["set"] not in developed_on]
    assert (len(rows), len(dev), len(held)) == (749, 362, 387)
    # the numbers docs/ESTIMATOR.md reports (rules 1-3 alone: 658, 322, 336; the demand alone
    # got 594 of 749; rule 6 changes no kernel's warps here, it moves `tile__s7_80` from under
    # to over)
    assert _agreement(rows) == (679, 748)
    assert _agreement(dev)[0] == 337
    assert _agreement(held)[0] == 342


@pytest.mark.parametrize(
    ("name", "kernels", "warps", "spills", "kf", "kf_warps", "held", "held_warps"),
    [
        # rules 1-5 gave 646, 182, 298 (rule 6 was chosen on seeds 7 and 23)
        ("h200_s23.json", 736, 648, 722, 196, 182, 342, 299),
        # rules 1-5: 718, 208, 353
        ("h200_s31.json", 807, 719, 803, 229, 208, 407, 354),
        # collected before rules 4 and 5 existed and kept from the sessions that made rules 4-6:
        # held out entirely (rules 1-5: 816, 87.6%; rules 1-3 alone gave 777, 83.5%)
        ("h200_s41.json", 931, 818, 931, 345, 307, 404, 348),
        # collected after rules 1-6 were merged, seen by no session that made them: 89.3%
        ("h200_s53.json", 934, 834, 930, 350, 312, 397, 354),
        # collected 2026-12-02 at 309646b, seen by no session that made a rule: 86.3%
        ("h200_s61.json", 977, 843, 971, 387, 334, 394, 339),
        # prepared at 309646b with seed 61, collected 2026-12-02 at d58523d: 88.8%; the one
        # spill missed is a private array the driver keeps in local memory (16 bytes, 32
        # registers; tile__s67_97.shared), which the gate reads from the driver at creation
        ("h200_s67.json", 970, 861, 969, 387, 334, 404, 364),
        # prepared and collected 2026-12-03 at 8fe9c9f, seen by no session that made a rule:
        # 88.2% (kernels.fuse 86.2%, the corpus 89.7%)
        ("h200_s73.json", 949, 837, 946, 406, 350, 373, 338),
        # prepared at 16decbf and collected 2026-12-04, seen by no session that made a rule:
        # 89.3% (kernels.fuse 86.2%, the corpus 91.3%)
        ("h200_s79.json", 1014, 905, 1013, 406, 350, 391, 361),
    ],
)
def test_warps_per_scheduler_on_later_seeds(
    name: str,
    kernels: int,
    warps: int,
    spills: int,
    kf: int,
    kf_warps: int,
    held: int,
    held_warps: int,
) -> None:
    """Seeds 23, 31 and 41, collected after rules 1-3 were made (docs/ESTIMATOR.md).  Rules 4 and
    5 were measured on seed 31's kernels.fuse and corpus batch 0, rule 6 on seeds 7 and 23; seed
    31's batches 1 and 2 and all of seed 41 are held out from every rule (kernels.fuse's kernels
    recur in every seed; with rules 1-3 alone: 618/723, 166, 290 for seed 23; 695/803, 192, 350
    for seed 31)."""
    _, rows = _rows(name)
    mine = [r for r in rows if r["set"] == "kf"]
    others = [r for r in rows if r["set"] not in ("kf", "c0")]
    assert (len(rows), len(mine), len(others)) == (kernels, kf, held)
    assert _agreement(rows) == (warps, spills)
    assert _agreement(mine)[0] == kf_warps
    assert _agreement(others)[0] == held_warps


def test_the_demand_alone_did_worse() -> None:
    """The rules earn their place: the SPIR-V demand with loads at their uses, floored at 16,
    gets fewer kernels' warps than the rules."""
    _, rows = _rows()
    plain = NvidiaRules(knee=255, offset=0, slope=0.0, window=0, reuse=0.0, dot_count=1 << 20)
    alone = [
        {**r, "features": {**r["features"], "dots": 0, "least": 0, "lane_words": 0.0}} for r in rows
    ]
    assert _agreement(alone, plain)[0] < 679 - 40


@pytest.mark.parametrize("spv", sorted(p.name for p in DATA.glob("*.spv")))
def test_features_of_the_measured_spirv(spv: str) -> None:
    """The analysis still reads the committed modules as it did when the rules were measured
    (`KIND.KERNEL.spv`: a kernel of seed 7's rows; `sSEED.KIND.KERNEL.spv`: of that seed's)."""
    name = spv.removesuffix(".spv")
    seed, rest = name.split(".", 1)
    other = seed.startswith("s") and seed[1:].isdigit()
    _, rows = _rows(f"h200_{seed}.json") if other else _rows()
    kind, kernel = (rest if other else name).split(".", 1)
    row = next(r for r in rows if (r["set"], r["kernel"]) == (kind, kernel))
    assert analyze_nvidia((DATA / spv).read_bytes()) == NvidiaFeatures(**row["features"])


def test_rules_on_hand_made_features() -> None:
    # the floor, the window of hoisted words, the knee and the reused words
    assert estimate_nvidia_registers(NvidiaFeatures(3, 1.0, 0.0)) == 16
    assert estimate_nvidia_registers(NvidiaFeatures(11, 64.0, 0.0)) == 11 - 2 + 24
    assert estimate_nvidia_registers(NvidiaFeatures(11, 20.0, 0.0)) == 11 - 2 + 10
    assert estimate_nvidia_registers(NvidiaFeatures(68, 8.0, 0.0)) == 28 + 20 - 2 + 4
    assert estimate_nvidia_registers(NvidiaFeatures(6, 2.0, 32.0)) == 6 - 2 + 1 + 64
    # past 255 the driver spills; a demand of 600 sunk is predicted to
    assert estimate_nvidia_registers(NvidiaFeatures(600, 0.0, 0.0)) > SM90.max_vgprs
    # rule 4: integer dot products take 32 up to a `least` of 28, a quarter of each register
    # above it, and never more than rules 1-3 give
    assert estimate_nvidia_registers(NvidiaFeatures(50, 57.0, 0.0, 40, 23, 0.0)) == 32
    assert estimate_nvidia_registers(NvidiaFeatures(43, 40.0, 0.0, 32, 39, 0.0)) == 32 + 3
    assert estimate_nvidia_registers(NvidiaFeatures(15, 4.0, 0.0, 8, 14, 0.0)) == 16
    assert estimate_nvidia_registers(NvidiaFeatures(565, 9.0, 0.0, 576, 569, 0.0)) == 168
    # rule 5: a lane loop's hoisted words on top of `sunk`
    assert estimate_nvidia_registers(NvidiaFeatures(3, 1.0, 0.0, 0, 0, 128.0)) == 3 - 2 + 128
    assert estimate_nvidia_registers(NvidiaFeatures(3, 1.0, 0.0, 0, 0, 8.0)) == 16
    # rule 6: a register tile (nearly all of `sunk` carried by a loop) takes all the block's
    # words on top of what it carries; a kernel that carries less keeps rules 1-5
    assert estimate_nvidia_registers(NvidiaFeatures(37, 32.0, 0.0, carried=35)) == 35 - 2 + 32
    assert estimate_nvidia_registers(NvidiaFeatures(37, 32.0, 0.0, carried=33)) == 47  # 46.5 up
    assert estimate_nvidia_registers(NvidiaFeatures(37, 32.0, 0.0)) == 47
    # ... and never lowers them
    assert estimate_nvidia_registers(NvidiaFeatures(11, 2.0, 16.0, carried=10)) == 11 - 2 + 1 + 32


@pytest.mark.shaderc
def test_the_sm90_estimate_is_the_drivers_count(kernels_build: Any) -> None:
    """The manifest's sm90 estimate is the count the rules predict from each kernel's SPIR-V;
    the AMD targets keep the demand."""
    differs = 0
    for b in kernels_build.kernels:
        record = next(
            k
            for r in kernels_build.manifest.regions
            for k in r.kernels()
            if k.name == b.kernel.name
        )
        sm90 = record.estimate("sm90", 32)
        predicted = estimate_nvidia_registers(analyze_nvidia(b.spv))
        assert sm90.vgprs == predicted + b.demand.private_words
        assert record.estimate("gfx1201", 32).vgprs == b.demand.vgprs + b.demand.private_words
        differs += predicted != b.demand.vgprs
    assert differs > len(kernels_build.kernels) // 2


@pytest.mark.shaderc
def test_a_warm_build_reads_the_features_from_the_memo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """codegen/build.py `_NvidiaMemo`: a second build of the same source measures no module
    again and writes the same manifest; an entry that does not read back as features is
    measured again, with the same result."""
    import random
    import sqlite3

    import fusec.codegen.build as build
    from tests.conftest import ROOT

    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    n = random.randrange(200, 5000)
    text = (ROOT / "tests" / "data" / "scale.fuse").read_text().replace("N = 1000", f"N = {n}")
    first = build.build_source(text, "r.fuse")
    assert all(b.nvidia == analyze_nvidia(b.spv) for b in first.kernels)

    def no_measuring(spv: bytes) -> NvidiaFeatures:
        raise AssertionError("measured although the module is in the memo")

    monkeypatch.setattr(build, "analyze_nvidia", no_measuring)
    assert build.build_source(text, "r.fuse").manifest == first.manifest
    monkeypatch.undo()
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))

    db = sqlite3.connect(tmp_path / "cache" / "objects" / "objects.sqlite")
    with db:
        db.execute("UPDATE nvidia_v3 SET sunk = 'x', words = -1")
    db.close()
    measured: list[bytes] = []

    def counting(spv: bytes) -> NvidiaFeatures:
        measured.append(spv)
        return analyze_nvidia(spv)

    monkeypatch.setattr(build, "analyze_nvidia", counting)
    again = build.build_source(text, "r.fuse")
    assert again.manifest == first.manifest
    assert len(measured) == len({b.spv for b in first.kernels})


def test_the_schedulers_order_on_a_quantized_contraction() -> None:
    """Rule 4's `least`: the unfused matvec stage of a q4_0 contraction (shaderc emitted every
    step's block reads, then every step's dot products) needs 24 registers once each step's
    products follow its reads, against 34 with the loads at their uses in our order; the order
    is a permutation of each block's rows that keeps every definition before its uses."""
    spv = (DATA / "kf.matvec_add_q4_0.unfused.1.spv").read_bytes()
    assert demand(spv, sink_loads=True).vgprs == 34
    ordered = demand(spv, sink_loads=True, reorder=least_order)
    assert (ordered.vgprs, ordered.loads_up) == (34, 24)
    f = analyze_nvidia(spv)
    assert (f.dots, f.least, f.lane_words) == (40, 24, 0.0)
    # the AMD demand does not read the scheduler
    assert demand(spv).vgprs == demand(spv, reorder=None).vgprs

    seen: list[int] = []

    def checked(rows: list[Any], live: set[int], vcost: dict[int, float]) -> list[Any]:
        out = least_order(rows, live, vcost)
        assert sorted(map(id, out)) == sorted(map(id, rows))
        position = {id(r): i for i, r in enumerate(out)}
        for i, r in enumerate(rows):
            for e in r.uses:
                made = [j for j in range(i) if e in rows[j].defs]
                if made:
                    assert position[id(rows[made[-1]])] < position[id(r)]
        seen.append(len(rows))
        return out

    demand(spv, sink_loads=True, reorder=checked)
    assert max(seen) > 100  # the flattened step of the contraction was scheduled


def test_a_lane_loop_the_driver_unrolls() -> None:
    """Rule 5: `lane_rows__s7_83.unfused.0`, 128 iterations of a `DontUnroll` loop reading
    a[j] (invariant in the grid-stride loop around it) and B[j * N + i]: 128 words hoisted; the
    driver gave it 169 registers (2 warps per scheduler, as the estimate's 129)."""
    spv = (DATA / "c2.lane_rows__s7_83.unfused.0.spv").read_bytes()
    f = analyze_nvidia(spv)
    assert (f.sunk, f.lane_words, f.dots) == (3, 128.0, 0)
    est = estimate_nvidia_registers(f)
    assert est == 129
    row = {"lds": 0, "workgroup": 256}
    assert _warps(est, row) == _warps(169, row) == 2
    # rules 1-3 alone gave the floor, 16 warps per scheduler
    assert _warps(estimate_nvidia_registers(NvidiaFeatures(3, 1.0, 0.0)), row) == 16


def test_a_register_tile() -> None:
    """Rule 6: `tile__s23_36` (seed 23, corpus batch 0) keeps 32-slot private arrays in registers
    through an iteration loop: 35 of its 37 registers (loads sunk) are live across the loop's back
    edge, and a block loads 32 words.  The driver gave it 72 registers; rules 1-5 gave 47 (10 warps
    per scheduler where the driver's count gives 7), rule 6 gives 65 (7)."""
    spv = (DATA / "s23.c0.tile__s23_36.spv").read_bytes()
    f = analyze_nvidia(spv)
    assert (f.sunk, f.carried, f.block_words, f.dots, f.lane_words) == (37, 35, 32.0, 0, 0.0)
    assert demand(spv, sink_loads=True).carried == 35
    assert demand(spv).carried == 0  # the AMD demand does not measure it
    row = {"lds": 0, "workgroup": 64}
    est = estimate_nvidia_registers(f)
    assert est == 65
    assert _warps(est, row) == _warps(72, row) == 7
    before = estimate_nvidia_registers(NvidiaFeatures(f.sunk, f.block_words, f.reuse_words))
    assert (before, _warps(before, row)) == (47, 10)
    # a kernel whose state is computed once, not carried by a loop, is not a tile to rule 6: the
    # unfused stages of the same region carry one or two registers
    _, rows = _rows("h200_s23.json")
    stages = [r for r in rows if r["kernel"].startswith("tile__s23_36.unfused")]
    assert stages and all(r["features"]["carried"] <= 2 for r in stages)
    assert all(
        estimate_nvidia_registers(NvidiaFeatures(**r["features"]))
        == estimate_nvidia_registers(NvidiaFeatures(**{**r["features"], "carried": 0}))
        for r in stages
    )
