"""codegen/plan.py `plan_runs`: independent phases rendered together.  Consecutive workgroup
reductions of which none reads another's result share one exchange through s_reduce (one pair
of barriers instead of a pair each); consecutive fills of shared arrays of which none reads or
writes another's array share one barrier, and fills over one extent share one loop.

Regions are generated (a random chain of reductions and fills, each reading earlier results or
not), so the runs the plan finds are checked against an independent reading of the chain, the
GLSL against the plan (barriers counted), and the kernels against the numpy reference on
lavapipe at random shapes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from fusec.codegen import plan
from fusec.codegen.build import build_source, write_build
from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build
from fusec.runtime.verify import check_region

OPS = ("sum", "max", "min")


def _chain(rng: np.random.Generator) -> tuple[str, list[tuple[str, str, set[str]]]]:
    """A per-workgroup region: 2-7 reductions and fills in a random order, each reading a
    random earlier result or none, and an output that reads all of them.  Returns the text and
    the stages as (kind, name, names read)."""
    stages: list[tuple[str, str, set[str]]] = []
    lines: list[str] = []
    scalars: list[str] = []
    fills: list[tuple[str, str]] = []  # (name, extent)
    for i in range(int(rng.integers(3, 8))):
        kind = "red" if rng.random() < 0.5 else "fill"
        reads: set[str] = set()
        extra = ""
        if scalars and rng.random() < 0.4:
            s = str(rng.choice(scalars))
            reads.add(s)
            extra = f" * (1.0 + 0.01 * {s})"
        src = ("x", "y")[i % 2]
        if kind == "red":
            name = f"s{i}"
            op = OPS[int(rng.integers(0, 3))]
            lines.append(f"    {name} = {op}(d: {src}[g, d]{extra}) @ workgroup")
            scalars.append(name)
        else:
            name = f"f{i}"
            ext = "D" if rng.random() < 0.6 else "E"
            body = f"{src}[g, d % E]{extra}"
            if fills and rng.random() < 0.4:
                other, other_ext = fills[int(rng.integers(0, len(fills)))]
                reads.add(other)
                body += f" + {other}[d % E]" if other_ext == "E" else f" + {other}[d]"
                if other_ext == "D":
                    ext = "D"  # read at d < D only
            lines.append(f"    {name}[d: {ext}] = {body}  in shared")
            fills.append((name, ext))
        stages.append((kind, name, reads))
    terms = [f"{s}" for s in scalars] + [f"{f}[d % E]" if e == "E" else f"{f}[d]" for f, e in fills]
    lines.append(f"    o[g, d] = {' + '.join(terms)}")
    text = (
        "region chain(x: f32[G, D], y: f32[G, D]) -> o: f32[G, D]\n"
        "    const G = 5 in 1 .. 64, D = 96 in 8 .. 512, E = 8 in 1 .. 8\n"
        "    launch workgroup 64, subgroup any\n"
        "    per workgroup g < G\n" + "\n".join(lines) + "\n"
    )
    return text, stages


def _expected_runs(stages: list[tuple[str, str, set[str]]]) -> list[list[str]]:
    """Runs by reading the chain: consecutive stages of one kind, none reading an earlier one
    of the run (reductions at most 4 to a run; a fill's array is written by itself alone)."""
    runs: list[list[str]] = []
    cur: list[str] = []
    kind = ""
    for k, name, reads in stages:
        joinable = (
            cur
            and k == kind
            and not (reads & set(cur))
            and not (k == "red" and len(cur) >= plan.MAX_JOINED_REDUCTIONS)
        )
        if joinable:
            cur.append(name)
            continue
        if len(cur) > 1:
            runs.append(cur)
        cur, kind = [name], k
    if len(cur) > 1:
        runs.append(cur)
    return runs


def _phase_name(p: object) -> str:
    return p.name if hasattr(p, "name") else p.array.name  # type: ignore[attr-defined]


@pytest.mark.parametrize("draw", range(6))
def test_generated_chains_join_only_independent_phases(
    dev: Device, tmp_path: Path, draw: int
) -> None:
    rng = np.random.default_rng()
    text, stages = _chain(rng)
    result = build_source(text, "chain.fuse")
    fused = next(b for b in result.kernels if b.kernel.name == "chain")
    kernel = fused.kernel
    planned = plan.plan_kernel(kernel)
    runs = [[_phase_name(kernel.phases[at]) for at in r.phases] for r in planned.runs]
    assert runs == _expected_runs(stages), text
    # barriers: a pair per reduction exchange, one after each fill, minus those the runs save
    reds = sum(k == "red" for k, _, _ in stages)
    fills = len(stages) - reds
    saved = sum(
        2 * (len(r.phases) - 1) if r.kind == plan.RunKind.REDUCTIONS else len(r.phases) - 1
        for r in planned.runs
    )
    main = fused.glsl[fused.glsl.index("void main()") :]
    assert len(re.findall(r"\bbarrier\(\);", main)) == 2 * reds + fills - saved, text
    # fills over one extent in one loop: one loop header per loop group
    for r in planned.runs:
        if r.kind == plan.RunKind.FILLS:
            assert sum(map(len, r.loops)) == len(r.phases)
            for group in r.loops:
                extents = {kernel.phases[at].var.extent for at in group}  # type: ignore[union-attr]
                assert len(extents) == 1
    consts = {"G": int(rng.integers(1, 9)), "D": int(rng.integers(8, 300)), "E": 1 + draw % 8}
    out = write_build(result, tmp_path / "b")
    rep = check_region(dev, Build.load(out), result.program.region("chain"), consts)
    assert rep.path == "fused"
    assert rep.ok, (text, consts, [(o.name, o.fused_error, o.unfused_error) for o in rep.outputs])


def test_a_run_of_five_reductions_is_cut_at_four() -> None:
    lines = "\n".join(f"    s{i} = sum(d: x[g, d] * {i + 1}.0) @ workgroup" for i in range(5))
    text = (
        "region five(x: f32[G, D]) -> o: f32[G, D]\n"
        "    const G = 5 in 1 .. 64, D = 96 in 8 .. 512\n"
        "    launch workgroup 64, subgroup any\n"
        "    per workgroup g < G\n"
        f"{lines}\n"
        "    o[g, d] = s0 + s1 + s2 + s3 + s4\n"
    )
    result = build_source(text, "five.fuse")
    kernel = next(b for b in result.kernels if b.kernel.name == "five").kernel
    runs = plan.plan_kernel(kernel).runs
    assert [r.phases for r in runs] == [(0, 1, 2, 3)]
    assert all(r.kind == plan.RunKind.REDUCTIONS for r in runs)
