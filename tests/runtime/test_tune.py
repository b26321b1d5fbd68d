"""`fusec tune`: the enumeration and its source edits, the checker's and the budget's drops, a
timed run on lavapipe with verification, the ranking without the target, `--json`, `--write`
and bad input.  (Timings on lavapipe mean nothing; nothing here asserts which is faster.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fusec.dsl.diagnostics import DiagnosticError
from fusec.runtime import tune
from fusec.runtime.tune import Filters, Schedule, StageLayout
from tests.conftest import (
    at_size,
    check_on_lavapipe,
    fusec_cli,
    rotated_sizes,
    skip_unless_lavapipe,
)

# a baseline far from the model's best (2 f16 per lane, one row per subgroup), so that the
# ranking picks another schedule and --write has something to write
SOURCE = """\
# a comment the edit must keep
region ffn(x: f32[H], Wg: f16[F, H], u: f32[F]) -> h: f32[F]
    const H = 256 in 1 .. 16384, F = 96 in 1 .. 1048576
    launch workgroup 128, subgroup any, rows_per_subgroup 1
    gate[f] = sum(k: Wg[f, k] * x[k])     layout f -> subgroup, k -> lane x 2
    h[f]    = silu(gate[f]) * u[f]

region norm(a: f32[K]) -> y: f32[K]
    const K = 512 in 1 .. 65536
    launch workgroup 256
    s = sum(k: a[k] * a[k])
    y[k] = a[k] * rsqrt(s / K + 1e-6)
"""


@pytest.fixture
def fuse(tmp_path: Path) -> Path:
    path = tmp_path / "t.fuse"
    path.write_text(SOURCE)
    return path


def _region(text: str = SOURCE, name: str = "ffn", target: str | None = None) -> tune.S.Region:
    return tune.find_region(text, "t.fuse", name, target)


FFN = tune.Subject("ffn", "ffn", ())


def test_baseline_is_the_source_as_written() -> None:
    base = tune.schedule_of(_region())
    assert base == Schedule(128, 1, (StageLayout("gate", "subgroup", 2),))
    assert tune.schedule_of(_region(name="norm")) == Schedule(256, None, ())
    assert tune.apply_schedule(SOURCE, "t.fuse", "ffn", base, "gfx1201") == SOURCE


def test_enumeration_applies_and_reads_back_every_schedule() -> None:
    """Every enumerated schedule, applied to the source as `schedule on gfx1201:` lines,
    reads back as itself on gfx1201, the region as every other target sees it is unchanged, and
    only lines are added at the end of the region (every other byte is kept)."""
    schedules = tune.enumerate_schedules(_region())
    # 5 workgroups x 5 rows x (2 row units x 3 f16 widths)
    assert len(schedules) == 5 * 5 * 6
    assert len(set(schedules)) == len(schedules)
    assert schedules[0] == tune.schedule_of(_region())
    for s in schedules:
        text = tune.apply_schedule(SOURCE, "t.fuse", "ffn", s, "gfx1201")
        assert tune.schedule_of(_region(text, target="gfx1201")) == s
        assert tune.schedule_of(_region(text, target="sm90")) == schedules[0]
        added = tune.changed_lines(SOURCE, text)
        assert (added == []) == (s == schedules[0])
        assert all(6 < n <= 8 for n in added)
        lines = text.splitlines()
        assert all(lines[n - 1].startswith("    schedule on gfx1201: ") for n in added)
        assert [x for i, x in enumerate(lines) if i + 1 not in added] == SOURCE.splitlines()
    norm = tune.enumerate_schedules(_region(name="norm"), max_workgroup=256)
    assert [s.workgroup for s in norm] == [256, 64, 128]  # baseline first; none above the limit


def test_filters_keep_the_baseline_and_its_nearest() -> None:
    f = Filters(workgroups=(128, 256), rows=(1, 2), max_candidates=4)
    got = tune.enumerate_schedules(_region(), filters=f)
    assert got[0] == tune.schedule_of(_region()) and len(got) == 4
    dist = [tune._distance(s, got[0]) for s in got]
    assert dist == sorted(dist) and dist[1] == 1
    assert all(s.workgroup in (128, 256) and s.rows_per_subgroup in (1, 2) for s in got)


def test_render_is_the_lines_written() -> None:
    s = Schedule(512, 3, (StageLayout("gate", "workgroup", 8),))
    want = [
        "schedule on gfx1201: workgroup 512, rows_per_subgroup 3",
        "schedule on gfx1201: gate layout f -> workgroup, k -> lane x 8",
    ]
    assert tune.render_schedule(SOURCE, "t.fuse", "ffn", s, "gfx1201") == want
    text = tune.apply_schedule(SOURCE, "t.fuse", "ffn", s, "gfx1201", "on a test 1.0 us")
    assert text.splitlines()[6:9] == ["    # tuned on a test 1.0 us", *("    " + x for x in want)]
    # only what differs: the launch alone
    s2 = Schedule(64, 1, (StageLayout("gate", "subgroup", 2),))
    assert tune.render_schedule(SOURCE, "t.fuse", "ffn", s2, "sm90") == [
        "schedule on sm90: workgroup 64"
    ]
    # applied again (another schedule, another comment): the earlier lines are replaced
    again = tune.apply_schedule(text, "t.fuse", "ffn", s2, "gfx1201", "on b")
    assert again.splitlines()[6:8] == [
        "    # tuned on b",
        "    schedule on gfx1201: workgroup 64",
    ]
    assert tune.changed_lines(SOURCE, again) == [7, 8]
    base = tune.schedule_of(_region())
    assert tune.apply_schedule(text, "t.fuse", "ffn", base, "gfx1201") == SOURCE


def test_vector_widths_follow_the_weight_dtype() -> None:
    assert tune.vector_widths("q8_0", 32) == (32,)  # a whole block per lane: integer dots
    assert tune.vector_widths("q4_0", 16) == (8, 16)  # dequantized
    assert tune.vector_widths("f16", 8) == (2, 4, 8)
    assert tune.vector_widths("f32", 4) == (1, 2, 4)
    assert tune.vector_widths("f32", 8) == (1, 2, 4, 8)  # the baseline is always in


@pytest.mark.shaderc
def test_every_candidate_is_built_or_dropped_with_a_reason(tmp_path: Path) -> None:
    """The property: each enumerated schedule is a candidate (its build launches as it says) or
    counted among the drops with a reason."""
    from fusec.codegen.targets import TARGETS
    from fusec.runtime.tune_build import build_candidates

    f = Filters(workgroups=(1024,), rows=(8,))
    schedules = tune.enumerate_schedules(_region(), filters=f)
    assert len(schedules) == 1 + 2 * 3
    cands, dropped = build_candidates(
        SOURCE, "t.fuse", FFN, schedules, tmp_path, "gfx1201", TARGETS["gfx1201"], None
    )
    assert len(cands) + sum(dropped.reasons.values()) == len(schedules)
    assert cands[0].baseline and cands[0].schedule == schedules[0]
    # rows -> workgroup takes at most 4 rows at a time: r8 with f -> workgroup is refused
    assert dropped.reasons == {
        ("checker", "rows -> workgroup takes at most 4 rows at a time, not 8"): 3
    }
    for c in cands:
        assert c.region == ("ffn" if c.baseline else "ffn__gfx1201")
        r = c.build.region(c.region)
        assert r.launch.workgroup == c.schedule.workgroup
        assert r.launch.rows_per_subgroup == c.schedule.rows_per_subgroup
        assert c.wave == 64 and c.estimates  # gfx1201's driver picks wave64 here


@pytest.mark.shaderc
def test_kept_builds_are_loaded_not_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--keep DIR`: a second run finds every candidate's build there and compiles nothing (a
    timing machine without a compiler), while the checker still drops what it refuses."""
    from fusec.codegen import build as codegen_build
    from fusec.runtime.tune_build import build_candidates

    schedules = tune.enumerate_schedules(_region(), filters=Filters(workgroups=(256,), rows=(8,)))
    first, dropped_first = build_candidates(
        SOURCE, "t.fuse", FFN, schedules, tmp_path, "gfx1201", None, None
    )

    def no_compiler(text: str, path: str, *args: object, **kwargs: object) -> None:
        codegen_build.check_source(text, path)  # build_source checks before compiling
        raise AssertionError("compiled although the build was kept")

    monkeypatch.setattr(codegen_build, "build_source", no_compiler)
    again, dropped_again = build_candidates(
        SOURCE, "t.fuse", FFN, schedules, tmp_path, "gfx1201", None, None
    )
    assert [c.schedule for c in again] == [c.schedule for c in first]
    assert [c.build.path for c in again] == [c.build.path for c in first]
    assert dropped_again.reasons == dropped_first.reasons and dropped_again.count("checker") == 3


@pytest.mark.shaderc
def test_budget_drops_what_it_refuses(tmp_path: Path) -> None:
    """`--budget vgprs<=N` refuses the candidates whose estimate needs more, as the budget gate
    refuses any fusion; those kept are within it."""
    from fusec.codegen.targets import TARGETS
    from fusec.runtime.tune_build import budget_rules, build_candidates

    f = Filters(workgroups=(128,), rows=(1, 8))
    schedules = tune.enumerate_schedules(_region(), filters=f)
    gfx = TARGETS["gfx1201"]
    everything, _ = build_candidates(
        SOURCE, "t.fuse", FFN, schedules, tmp_path / "a", "gfx1201", gfx, None
    )
    most = max(e.vgprs for c in everything for _, e in c.estimates)
    least = min(e.vgprs for c in everything for _, e in c.estimates)
    assert least < most
    limit = (least + most) // 2
    rules = budget_rules([f"vgprs<={limit}"], "gfx1201")
    kept, dropped = build_candidates(
        SOURCE, "t.fuse", FFN, schedules, tmp_path / "b", "gfx1201", gfx, None, rules
    )
    assert dropped.count("budget") >= 1
    assert ("budget", "gfx1201 wave64: VGPRs") in dropped.reasons
    for c in kept[1:]:  # the baseline is kept whatever the budget says
        assert all(e.vgprs <= limit for _, e in c.estimates)
    assert len(kept) + dropped.count("budget") == len(everything)


def _tune_json(root: Path, args: list[str], file: str = "kernels.fuse") -> dict[str, Any]:
    proc = fusec_cli(
        ["tune", file, *args, "--no-actual", "--json"],
        capture_output=True,
        text=True,
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


@pytest.mark.shaderc
@pytest.mark.slow
def test_budget_drops_a_schedule_that_spills(root: Path) -> None:
    """rms_norm_gated_ffn_q4_K at 8 rows per subgroup in a workgroup of 1024 would spill on
    navi21 (estimated demand 206 VGPRs, 78 spilled, when 16 waves of 64 share a workgroup):
    refused by the budget gate and counted, while 2 rows per subgroup in the same workgroup is
    kept."""
    out = _tune_json(
        root,
        [
            "--region",
            "rms_norm_gated_ffn_q4_K",
            "--target",
            "navi21",
            "--rows",
            "2,8",
            "--workgroups",
            "1024",
        ],
    )
    budget = {d["reason"]: d["count"] for d in out["dropped"] if d["stage"] == "budget"}
    assert budget == {"navi21 wave64: would spill": 1}
    labels = [c["label"] for c in out["candidates"]]
    assert "wg1024 r8 gate,up:subgroup/x32" not in labels
    assert "wg1024 r2 gate,up:subgroup/x32" in labels
    assert all(c["verdict"] == "within budget" for c in out["candidates"])


@pytest.mark.shaderc
@pytest.mark.slow
def test_budget_drops_a_schedule_with_too_few_waves(root: Path, tmp_path: Path) -> None:
    """A gated FFN of q4_0 weights dequantized 16 per lane (the region kernels.fuse once wrote
    out as gated_ffn_q4_0_dequant; now an instance with a schedule block of its own, which tune
    does not rewrite) at 8 rows per subgroup has too few waves on gfx1201: refused by the
    default budget, counted, not ranked."""
    fuse = tmp_path / "dequant.fuse"
    fuse.write_text(
        "region gated_ffn_q4_0_dequant(x: f32[H], Wg: q4_0[F, H], Wu: q4_0[F, H]) -> h: f32[F]\n"
        "    const H = 4096 in 32 .. 16384, F = 12288 in 1 .. 1048576\n"
        "    launch workgroup 256, subgroup any, rows_per_subgroup 4\n"
        "    gate[f] = sum(k: Wg[f, k] * x[k])  layout f -> subgroup, k -> lane x 16\n"
        "    up[f]   = sum(k: Wu[f, k] * x[k])  layout f -> subgroup, k -> lane x 16\n"
        "    h[f]    = silu(gate[f]) * up[f]\n"
    )
    out = _tune_json(
        root,
        [
            "--region",
            "gated_ffn_q4_0_dequant",
            "--target",
            "gfx1201",
            "--rows",
            "8",
            "--workgroups",
            "256",
        ],
        str(fuse),
    )
    budget = [d for d in out["dropped"] if d["stage"] == "budget"]
    assert budget and budget[0]["reason"] == "gfx1201 wave64: waves per SIMD"
    labels = [c["label"] for c in out["candidates"]]
    assert "wg256 r8 gate,up:subgroup/x16" not in labels
    assert "wg256 r8 gate,up:subgroup/x8" in labels


@pytest.mark.shaderc
def test_ranked_without_the_target_json_and_reasoning(fuse: Path) -> None:
    proc = fusec_cli(
        [
            "tune",
            str(fuse),
            "--region",
            "ffn",
            "--target",
            "gfx1201",
            "--workgroups",
            "128",
            "--rows",
            "1,2",
            "--no-actual",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ranked by the estimator without timing" in proc.stderr
    out = json.loads(proc.stdout)
    assert out["mode"] == "ranked" and out["target"] == "gfx1201" and out["device"] is None
    assert "is not gfx1201" in out["why_ranked"] or "no Vulkan device" in out["why_ranked"]
    assert set(out) >= {"region", "file", "enumerated", "dropped", "baseline", "winner"}
    rows = out["candidates"]
    assert [r["rank"] for r in rows] == list(range(1, len(rows) + 1))
    assert sum(r["baseline"] for r in rows) == 1
    assert out["winner"] == rows[0]["label"]
    for r in rows:
        assert set(r) >= {"label", "schedule", "source", "verdict", "waves_per_simd", "vgprs"}
        assert r["reasoning"].startswith(f"waves {r['waves_per_simd']} at ")
        assert "rows per workgroup" in r["reasoning"] and "in flight per SIMD" in r["reasoning"]
        assert r["source"] == ["(as the file has it)"] or all(
            x.startswith("schedule on gfx1201: ") for x in r["source"]
        )
    # the baseline moves 2 f16 x 1 row per lane, 4 KiB per SIMD; the winner more
    best, base = rows[0], next(r for r in rows if r["baseline"])
    assert best["in_flight_bytes"] > base["in_flight_bytes"]


@pytest.mark.shaderc
def test_write_is_idempotent_and_keeps_every_other_byte(fuse: Path) -> None:
    args = ["tune", str(fuse), "--region", "ffn", "--target", "gfx1201", "--workgroups", "128"]
    args += ["--rows", "1,2", "--no-actual", "--json", "--write"]
    first = fusec_cli(args, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert out["written"] is True and out["winner"] != out["baseline"]
    text = fuse.read_text()
    added = tune.changed_lines(SOURCE, text)
    lines = text.splitlines()
    assert lines[added[0] - 1].startswith("    # tuned for gfx1201 ")
    assert "ranked by the estimator (not timed): waves " in text
    assert [x for i, x in enumerate(lines) if i + 1 not in added] == SOURCE.splitlines()
    winner = next(c for c in out["candidates"] if c["label"] == out["winner"])
    assert [x.strip() for x in lines if x.strip().startswith("schedule")] == winner["source"]
    mine = tune.schedule_of(_region(text, target="gfx1201"))
    assert mine.label() == out["winner"]
    assert tune.schedule_of(_region(text)) == tune.schedule_of(_region())
    second = fusec_cli(args, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    again = json.loads(second.stdout)
    assert again["written"] is False and again["winner"] == again["baseline"]
    assert "already holds the winning schedule" in second.stderr
    assert fuse.read_text() == text


def test_write_refuses_a_file_changed_meanwhile(fuse: Path) -> None:
    from fusec.dsl.source_file import Stored
    from fusec.runtime.tune_cmd import _write

    s = Schedule(256, 2, (StageLayout("gate", "subgroup", 8),))
    fuse.write_text(SOURCE + "# edited by someone else\n")
    with pytest.raises(DiagnosticError, match="changed while tuning; not written"):
        _write(str(fuse), SOURCE, Stored("", "\n"), FFN, s, "gfx1201", "on a test")
    assert fuse.read_text() == SOURCE + "# edited by someone else\n"


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_timed_on_lavapipe_side_by_side(fuse: Path) -> None:
    """The present device (lavapipe, subgroup 8, timed as if it were an sm90 with `--time`):
    each candidate verified against the numpy reference, then timed in batches of 2 (the
    baseline in each); ratios are to the baseline timed beside each candidate."""
    proc = fusec_cli(
        [
            "tune",
            str(fuse),
            "--region",
            "ffn",
            "--target",
            "sm90",
            "--time",
            "--const",
            "H=96",
            "--const",
            "F=40",
            "--max-candidates",
            "3",
            "--batch",
            "2",
            "--reps",
            "2",
            "--submissions",
            "2",
            "--seed",
            "7",
            "--json",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["mode"] == "timed" and out["consts"] == {"H": 96, "F": 40}
    assert out["batches"] == 2 and len(out["baseline_us_per_batch"]) == 2
    rows = out["candidates"]
    assert len(rows) == 3 and sum(r["baseline"] for r in rows) == 1
    base = next(r for r in rows if r["baseline"])
    assert base["ratio"] == 1.0
    assert sorted(r["batch"] for r in rows if not r["baseline"]) == [0, 1]
    ratios = [r["ratio"] for r in rows]
    assert ratios == sorted(ratios)
    for r in rows:
        assert r["path"] == "fused" and 0 <= r["error_of_tolerance"] <= 1
        assert r["samples"] == 2 * 2 and r["median_us"] > 0
        if not r["baseline"]:
            beside = out["baseline_us_per_batch"][r["batch"]]
            assert r["ratio"] == pytest.approx(r["median_us"] / beside, rel=1e-3)
    assert out["winner"] == rows[0]["label"]


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_a_wrong_candidate_is_dropped_loudly(tmp_path: Path) -> None:
    """A candidate whose kernels compute something else (here: twice the gate) is dropped with
    a warning naming its output, and the others are timed."""
    from fusec.codegen.build import check_source
    from fusec.runtime.device import Device
    from fusec.runtime.tune_build import build_candidates
    from fusec.runtime.tune_time import draw, time_candidates

    schedules = tune.enumerate_schedules(_region(), filters=Filters(max_candidates=3))
    good, dropped = build_candidates(
        SOURCE, "t.fuse", FFN, schedules, tmp_path / "a", "sm90", None, None
    )
    wrong_text = SOURCE.replace("h[f]    = silu(gate[f])", "h[f]    = silu(2.0 * gate[f])")
    wrong, _ = build_candidates(
        wrong_text, "t.fuse", FFN, [schedules[1]], tmp_path / "b", "sm90", None, None
    )
    wrong = [attrs_evolve(wrong[0], baseline=False)]
    region_ir = check_source(SOURCE, "t.fuse").regions[0]
    warnings: list[str] = []
    with Device() as dev:
        drawn = draw(region_ir, good[0], {"H": 64, "F": 24}, seed=3)
        timed = time_candidates(
            dev, region_ir, [good[0], *wrong, good[2]], drawn, dropped, warnings.append,
            reps=2, submissions=1,
        )  # fmt: skip
    assert [t.candidate.schedule for t in timed] == [schedules[0], schedules[2]]
    assert len(warnings) == 1 and "output 'h' differs from the reference" in warnings[0]
    assert dropped.count("mismatch") == 1


def attrs_evolve(c: object, **changes: object) -> object:
    import attrs

    return attrs.evolve(c, **changes)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--region", "nope"], "fusec: error: no region 'nope' in "),
        (["--region", "ffn", "--target", "gfx9000"], "fusec: error: unknown target 'gfx9000'"),
        (
            ["--region", "ffn", "--target", "gfx1201", "--budget", "waves<=3"],
            "fusec: error: --budget takes waves>=N, vgprs<=N or spills<=N, not 'waves<=3'",
        ),
        (
            ["--region", "ffn", "--target", "gfx1201", "--max-candidates", "1"],
            "fusec: error: no schedule of region 'ffn' is left besides its own: nothing else "
            "was enumerated",
        ),
        (
            [
                "--region",
                "ffn",
                "--target",
                "gfx1201",
                "--workgroups",
                "128",
                "--rows",
                "1",
                "--budget",
                "vgprs<=1",
            ],
            "fusec: error: no schedule of region 'ffn' is left besides its own: dropped 5 by "
            "the budget",
        ),
        (
            ["--region", "ffn"],
            "fusec: error: the device present (llvmpipe",
        ),
        (["--region", "ffn", "--time"], "fusec: error: --time needs --target T"),
    ],
)
def test_bad_input_is_one_sentence(fuse: Path, extra: list[str], message: str) -> None:
    proc = fusec_cli(["tune", str(fuse), *extra, "--no-actual"], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    assert fuse.read_text() == SOURCE


GENERIC = Path(__file__).parents[1] / "data" / "generic.fuse"


def test_an_instance_enumerates_with_its_dtype_and_target() -> None:
    """`proj<q8_0>` on sm90 starts from its variant there (4 rows per subgroup, a whole q8_0
    block per lane: integer dots only), `proj<f16>` from the f16 widths; the old instance name
    and the display name are the same instance."""
    text = GENERIC.read_text()
    q8 = tune.resolve(text, "g.fuse", "proj<q8_0>")
    assert q8 == tune.resolve(text, "g.fuse", "proj_q8_0")
    assert q8 == tune.Subject("proj", "proj_q8_0", (("Wt", "q8_0"),))
    on_sm90 = tune.instance_region(text, "g.fuse", q8, "sm90")
    assert on_sm90.name == "proj_q8_0__sm90"
    assert tune.schedule_of(on_sm90) == Schedule(64, 4, (StageLayout("y", "subgroup", 32),))
    got = tune.enumerate_schedules(on_sm90)
    assert {lay.vector for s in got for lay in s.layouts} == {32}
    f16 = tune.instance_region(text, "g.fuse", tune.resolve(text, "g.fuse", "proj"), "gfx1201")
    assert f16.name == "proj"
    assert {lay.vector for s in tune.enumerate_schedules(f16) for lay in s.layouts} == {2, 4, 8}
    with pytest.raises(DiagnosticError, match="no region 'proj<q6_K>'"):
        tune.resolve(text, "g.fuse", "proj<q6_K>")


@pytest.mark.shaderc
def test_a_tuned_instance_changes_only_its_own_variant(tmp_path: Path) -> None:
    """A schedule written for `proj<q8_0>` on sm90 is one `schedule on sm90 when Wt = q8_0:`
    line; rebuilt, every other kernel's SPIR-V is byte-identical, the variant's launch is the
    schedule's, and writing it again changes nothing."""
    from fusec.codegen.build import build_source, write_build

    text = GENERIC.read_text()
    s = Schedule(128, 2, (StageLayout("y", "subgroup", 32),))
    new = tune.apply_schedule(text, "g.fuse", "proj<q8_0>", s, "sm90", "on a test: 1.0 us")
    added = tune.changed_lines(text, new)
    assert [new.splitlines()[n - 1] for n in added] == [
        "    # tuned on a test: 1.0 us",
        "    schedule on sm90 when Wt = q8_0: workgroup 128, rows_per_subgroup 2",
    ]
    assert added[0] == 14  # after the region's last schedule line, before the next region
    assert tune.apply_schedule(new, "g.fuse", "proj_q8_0", s, "sm90", "on a test: 1.0 us") == new
    before = write_build(build_source(text, "g.fuse"), tmp_path / "before")
    after = write_build(build_source(new, "g.fuse"), tmp_path / "after")
    old = {p.name: p.read_bytes() for p in Path(before).glob("*.spv")}
    got = {p.name: p.read_bytes() for p in Path(after).glob("*.spv")}
    assert set(old) == set(got)
    changed = {n for n in old if old[n] != got[n]}
    assert changed and all(n.startswith("proj_q8_0__sm90.") for n in changed)
    from fusec.runtime.dispatch import Build

    r = Build.load(Path(after)).region("proj_q8_0__sm90")
    assert (r.launch.workgroup, r.launch.rows_per_subgroup) == (128, 2)


@pytest.mark.shaderc
def test_from_json_writes_what_write_would(tmp_path: Path) -> None:
    """A `--json` run's winner written later with `--from-json FILE --write` gives the bytes
    `--write` gives (the comment included); refused once the instance's schedule changed."""
    # 2 f16 per lane: too few bytes in flight on gfx1201, so the ranking prefers another
    text = GENERIC.read_text().replace("k -> lane x 4\n", "k -> lane x 2\n", 1)
    one, two = tmp_path / "one.fuse", tmp_path / "two.fuse"
    one.write_text(text)
    two.write_text(text)
    args = ["--region", "proj<f16>", "--target", "gfx1201", "--no-actual", "--json"]
    args += ["--workgroups", "64,128", "--rows", "1,2"]
    ran = fusec_cli(["tune", str(one), *args, "--write"], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    assert out["written"] is True and out["region"] == "proj<f16>"
    assert out["lines_for"] == "gfx1201" and out["instance"] == "proj"
    record = tmp_path / "r.json"
    record.write_text(json.dumps(out))
    wrote = fusec_cli(
        ["tune", str(two), "--from-json", str(record), "--write"], capture_output=True, text=True
    )
    assert wrote.returncode == 0, wrote.stderr
    assert two.read_text() == one.read_text() != text
    assert "schedule on gfx1201 when Wt = f16: " in two.read_text()
    # the file moved on: the instance's schedule there is neither the baseline nor the winner
    moved = text.replace(
        "launch workgroup 64, subgroup any, rows_per_subgroup 1\n    xs",
        "launch workgroup 256, subgroup any, rows_per_subgroup 1\n    xs",
    )
    assert moved != text
    two.write_text(moved)
    refused = fusec_cli(
        ["tune", str(two), "--from-json", str(record), "--write"], capture_output=True, text=True
    )
    assert refused.returncode == 1
    assert "not the tuned run's baseline" in refused.stderr and two.read_text() == moved
    # a record naming a target no fusec knows (edited, or from another version): the file
    # would no longer build, so nothing is written (found by a new-user probe)
    two.write_text(text)
    record.write_text(json.dumps({**out, "lines_for": "gfx9"}))
    broken = fusec_cli(
        ["tune", str(two), "--from-json", str(record), "--write"], capture_output=True, text=True
    )
    assert broken.returncode == 1, broken.stderr
    assert broken.stderr.startswith("fusec: error: ") and "Traceback" not in broken.stderr
    assert "gfx9" in broken.stderr and two.read_text() == text


@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.parametrize(
    ("width", "subgroup"),
    [
        pytest.param(128, 4, marks=pytest.mark.slow),
        (256, 8),
        pytest.param(512, 16, marks=pytest.mark.slow),
    ],
)
def test_every_target_variant_of_kernels_fuse_verifies(
    root: Path, width: int, subgroup: int
) -> None:
    """The schedules `fusec tune --write` wrote into kernels.fuse for a target (`on gfx1201`:
    ranked, never run on an RDNA4; `on sm90`: timed on the H200): each such variant matches the
    numpy reference on lavapipe, at small shapes, at two of the three subgroup sizes."""
    from fusec.codegen.build import check_source

    skip_unless_lavapipe()
    program = check_source((root / "kernels.fuse").read_text(), "kernels.fuse")
    every = [r.name for r in program.regions if r.name.endswith(("__gfx1201", "__sm90"))]
    assert len(every) >= 6
    # two of the three sizes each (conftest.rotated_sizes), by target
    kinds: dict[str, list[str]] = {}
    for v in every:
        kinds.setdefault(v.rsplit("__", 1)[1], []).append(v)
    variants = at_size(rotated_sizes(kinds), subgroup)
    # the K-quants' rows are whole super-blocks of 256 (the packed sm90 variants)
    kquant = [v for v in variants if "_q4_K" in v or "_q6_K" in v]
    consts = {r.name: {c.name for c in r.consts} for r in program.regions}
    for group, k in (([v for v in variants if v not in kquant], 224), (kquant, 512)):
        if not group:  # (no --region would check every region of the file)
            continue
        regions = [x for v in group for x in ("--region", v)]
        # the small shapes, for the constants the group's regions have
        small = {"K": k, "N": 33, "H": k, "F": 33}
        have = {c for v in group for c in consts[v]}
        sizes = [a for c, n in small.items() if c in have for a in ("--const", f"{c}={n}")]
        out = check_on_lavapipe(["kernels.fuse", *regions, "--seed", "11", *sizes], width, subgroup)
        assert out.count(" ok\n") >= len(group)
        for v in group:
            assert f"\n{v} [" in out


@pytest.mark.shaderc
@pytest.mark.vulkan
@pytest.mark.slow
def test_tune_h200_script_end_to_end_on_lavapipe(root: Path, tmp_path: Path) -> None:
    """bench/tune_h200.sh with the tiny preset on lavapipe (timed as if an sm90): a table row
    per call named by instance, one JSON per call, nothing written into kernels.fuse; then
    each result written into a copy with `--from-json`, which builds."""
    import os
    import subprocess
    import sys

    from fusec.codegen.build import check_source

    before = (root / "kernels.fuse").read_text()
    out = tmp_path / "out"
    env = {
        **os.environ,
        "OUT": str(out),
        "PRESET": "tiny",
        "WEIGHTS": "q4_0",
        "MAXC": "2",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(root),
        "FUSEC_DEVICE": "llvmpipe",
        "EXTRA": "--target sm90 --time --reps 2 --submissions 2 --seed 5",
    }
    proc = subprocess.run(
        ["bash", "bench/tune_h200.sh"], capture_output=True, text=True, env=env, cwd=root
    )
    assert proc.returncode == 0, proc.stderr
    assert (root / "kernels.fuse").read_text() == before
    table = (out / "tune_h200.md").read_text()
    for name in ("rms_norm_mul_matvec<q4_0>", "rms_norm_gated_ffn<q4_0>", "matvec_add<q4_0>"):
        assert f"| {name} (" in table
    assert "not tuned" not in table
    results = sorted((out / "json-q4_0").glob("*.json"))
    from fusec.runtime import decode_layer as layer

    calls = layer.calls(layer.PRESETS["tiny"], "q4_0")  # one result per call of the layer
    assert len(results) == len(calls) and json.loads((out / "tune_h200.json").read_text())["q4_0"]
    copy = tmp_path / "k.fuse"
    copy.write_text(before)
    for r in results:
        if "matvec_add_q4_0_K512" in r.name:
            continue  # the same instance as matvec_add_q4_0 at K=256 (README)
        got = fusec_cli(
            ["tune", str(copy), "--from-json", str(r), "--write"], capture_output=True, text=True
        )
        assert got.returncode == 0, got.stderr
        rec = json.loads(r.read_text())
        if rec["winner"] != rec["baseline"]:
            assert json.loads(got.stdout)["written"] is True
            assert f"# tuned on {rec['device']}" in copy.read_text()
    check_source(copy.read_text(), str(copy))


@pytest.mark.shaderc
def test_from_json_refuses_a_damaged_record_in_one_sentence(tmp_path: Path) -> None:
    """A `--json` record whose fields `--from-json` reads are missing or of the wrong type
    (no candidates, a region that is a number, a schedule without its workgroup, no baseline)
    is "no `fusec tune --json` result", exit 1, the .fuse untouched (an empty candidate list
    and an integer region were internal errors; found by a new-user probe)."""
    import random

    text = GENERIC.read_text()
    src = tmp_path / "g.fuse"
    src.write_text(text)
    args = ["--region", "proj<f16>", "--target", "gfx1201", "--rank", "--json"]
    args += ["--workgroups", "64,128", "--rows", "1,2"]  # few candidates: the test is of records
    ran = fusec_cli(["tune", str(src), *args], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    good = json.loads(ran.stdout)

    def damaged(rng: random.Random) -> dict[str, Any]:
        d = json.loads(json.dumps(good))
        first = d["candidates"][0]["schedule"]
        kind = rng.randrange(8)
        if kind == 0:
            d["candidates"] = []
        elif kind == 1:
            d["region"] = rng.choice([5, None, ["proj"], {"r": 1}])
        elif kind == 2:
            del d[rng.choice(["region", "lines_for", "candidates"])]
        elif kind == 3:
            del first[rng.choice(["workgroup", "rows_per_subgroup", "layouts"])]
        elif kind == 4:
            first["workgroup"] = rng.choice(["64", 0, -1, 2.5, None])
        elif kind == 5:
            for c in d["candidates"]:
                c["baseline"] = False
        elif kind == 6:
            first["layouts"] = [{"stage": "y"}]
        else:
            d["lines_for"] = rng.choice([7, None, []])
        return d

    rng = random.Random(random.randrange(2**32))
    record = tmp_path / "r.json"
    for _ in range(6):
        record.write_text(json.dumps(damaged(rng)))
        run = fusec_cli(
            ["tune", str(src), "--from-json", str(record), "--write"],
            capture_output=True,
            text=True,
        )
        assert run.returncode == 1, (run.returncode, run.stderr)
        assert run.stderr == f"fusec: error: {record} is no `fusec tune --json` result\n"
        assert src.read_text() == text


@pytest.mark.shaderc
def test_tune_reads_and_writes_a_file_as_it_is_stored(tmp_path: Path) -> None:
    """A byte order mark and CRLF or CR line endings: tune reads such a file as build does
    (a mark was 'unexpected character', a CR-only file 'defines no region') and `--write`
    gives back the LF result stored the same way, mark and endings kept throughout (it added
    LF lines to a CRLF file; found by a new-user probe)."""
    import random

    # 2 f16 per lane: too few bytes in flight on gfx1201, so the ranking prefers another
    text = GENERIC.read_text().replace("k -> lane x 4\n", "k -> lane x 2\n", 1)
    args = ["--region", "proj<f16>", "--target", "gfx1201", "--rank", "--write"]
    args += ["--workgroups", "64,128", "--rows", "1,2"]  # few candidates: the test is of files
    plain = tmp_path / "plain.fuse"
    plain.write_text(text)
    ran = fusec_cli(["tune", str(plain), *args], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    want = plain.read_text()
    assert want != text
    bom, newline = random.choice([("\ufeff", "\r\n"), ("", "\r"), ("\ufeff", "\n"), ("", "\r\n")])
    odd = tmp_path / "odd.fuse"
    odd.write_bytes((bom + text.replace("\n", newline)).encode())
    ran = fusec_cli(["tune", str(odd), *args], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert odd.read_bytes() == (bom + want.replace("\n", newline)).encode()


@pytest.mark.parametrize("sizes", ["100", "2048", "64,96", "3"])
def test_workgroups_that_are_no_workgroup_size_are_refused(sizes: str) -> None:
    """`--workgroups 100` ran and then said "nothing else was enumerated" (a new-user probe):
    a size that is not a power of two up to the target's limit is refused before any work."""
    args = ["tune", str(GENERIC), "--region", "proj<f16>", "--target", "gfx1201", "--rank"]
    run = fusec_cli([*args, "--workgroups", sizes], capture_output=True, text=True)
    bad = next(w for w in sizes.split(",") if int(w) & (int(w) - 1) or int(w) > 1024)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr == (
        f"fusec: error: --workgroups {bad} is not a workgroup size here\n"
        "  hint: use powers of two from 1 to 1024, e.g. 64,256\n"
    )


def test_a_const_of_no_constant_is_refused_in_every_mode() -> None:
    """`--const ZZ=3` was taken with a note in a ranking (a new-user probe): a name the region
    has no constant of is refused, as fusec check refuses it."""
    args = ["tune", str(GENERIC), "--region", "proj<f16>", "--target", "gfx1201", "--rank"]
    run = fusec_cli([*args, "--const", "ZZ=3"], capture_output=True, text=True)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.startswith("fusec: error: --const ZZ: proj<f16> has no constant 'ZZ'\n")
    assert "  hint: its constants: " in run.stderr
