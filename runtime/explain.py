"""`fusec explain FILE --region R [--target T]`: what each stage of a region became.

For the fused product, then every kernel of the unfused chain: the kernel's launch (workgroup,
subgroup, grid), then its phases in order: the stage each computes (its source line), what the
phase is (a contraction and its layout over subgroups and lanes, a fill of shared memory and
its barrier, a tile program with its shuffles or shared-memory exchanges, ...), where its result
lives, and the phase's share of the register estimate: the most VGPRs live while its code runs,
measured by the estimator's own liveness analysis (codegen/liveness.py) on the kernel compiled
again with line information.  Then the estimate and the gate's verdict on the target, and the
GLSL each phase produced, highlighted.  Decisions are read from the kernel IR and the manifest;
nothing is decided here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from fusec.codegen import kir
from fusec.codegen import manifest_records as mr
from fusec.codegen.build import BuildResult, BuiltKernel
from fusec.codegen.liveness import breakdown
from fusec.codegen.shaderc import compile_glsl
from fusec.dsl import ir
from fusec.dsl.ir import format_expr
from fusec.dsl.span import Source
from fusec.dsl.types import Scope

_LINE = re.compile(r'^#line (\d+) "')
GLSL_LINES_SHOWN = 24  # per phase; the rest is counted


def phase_kind(p: kir.Phase) -> tuple[str, str]:
    """(what the phase is, where its result goes), in words."""
    match p:
        case kir.Contract():
            lay = p.layout
            if lay.row_unit == Scope.LANE:
                how = "contraction: one row per lane, the lane reduces it alone"
            else:
                how = (
                    f"contraction: {p.rows} row(s) per {lay.row_unit.value}, the reduced index "
                    f"over the lanes, {lay.vector} element(s) per lane per step, then a "
                    "subgroup reduction"
                )
                if kir.int_dot_terms(p):
                    how += "; integer dot products on q8_0 blocks"
            where = (
                f"shared memory ({p.buffer.name})"
                if isinstance(p.buffer, kir.SharedArray)
                else f"global buffer {p.buffer.name}"
            )
            return how, where
        case kir.FillShared():
            return (
                "the workgroup fills a shared array, then a barrier (one after a run of fills "
                "that do not read each other)",
                f"shared memory ({p.array.name})",
            )
        case kir.QuantizeBlocks():
            return "rounded to q8_0 blocks (4 lanes per block)", "q8_0 blocks"
        case kir.ScalarPhase():
            scopes = sorted({r.scope.value for r in kir.reduces_in(p.value)})
            how = "a value every lane computes"
            if scopes:
                how += f", with a {' and '.join(scopes)} reduction"
            return how, "a register of every lane"
        case kir.SelectRows():
            return (
                f"{p.reduce.op} per row: one row per subgroup at a time, the reduced index "
                "over its lanes",
                f"global buffer {p.buffer.name}",
            )
        case kir.TopKPhase():
            k = ir.format_expr(p.reduce.k) if p.reduce.k is not None else "k"
            return (
                f"the {k} largest values and their indices: {k} rounds of "
                f"an argmax with a {p.reduce.scope.value} reduction, then a barrier",
                f"shared memory ({p.values.name}, {p.indices.name})",
            )
        case kir.StoreScalar():
            return "one value, stored by one lane", f"global buffer {p.buffer.name}"
        case kir.StoreMap():
            how = "elementwise over the index, grid-stride" + (", masked" if p.mask else "")
            return how, f"global buffer {p.buffer.name}"
        case kir.TilePhase():
            t = p.tile
            dims = ", ".join(f"{d.name}: {format_expr(d.extent)}" for d in t.dims)
            cross = "subgroup shuffles" if p.exchange == "shuffle" else "shared memory"
            return (
                f"tile ({dims}): {t.lanes} lane(s) and {t.slots} slot(s) per group; values "
                f"cross lanes by {cross}",
                "registers: one element per lane and slot",
            )
        case kir.SplitK():
            return (
                "this workgroup's slice of the reduction, added with float atomics",
                f"global buffer {p.buffer.name}",
            )
        case kir.Arrive():
            of = "" if p.group is None else " of its group"
            return (
                f"every workgroup counts its share done; the last{of} to arrive computes the "
                "stages after, the others end",
                f"counter {p.counter.name} (reset by the last workgroup{of})",
            )
    return type(p).__name__, ""


def glsl_by_line(glsl: str) -> dict[int, list[str]]:
    """The GLSL each `.fuse` line produced: the lines after each `#line N` directive."""
    out: dict[int, list[str]] = {}
    current: int | None = None
    for text in glsl.splitlines():
        m = _LINE.match(text)
        if m:
            current = int(m.group(1))
            continue
        if current is not None and text.strip():
            out.setdefault(current, []).append(text)
    return out


def _kernel_report(
    console: Console,
    b: BuiltKernel,
    source: Source,
    estimates: Sequence[mr.Estimate],
    target: str,
    sources: dict[str, Source],
) -> None:
    k = b.kernel
    spv = compile_glsl(b.glsl, k.name, sources, debug=True)
    parts = breakdown(spv)
    sub = k.subgroup
    sizes = ", ".join(map(str, sub.sizes)) if sub.sizes else ""
    console.print(
        Text.assemble(
            (f"kernel {k.name}", "bold"),
            f": workgroup {k.workgroup_size}, subgroup {sub.kind}{(' ' + sizes) if sizes else ''}",
            f", {len(k.bindings)} buffer(s), stages {', '.join(k.stages)}",
        )
    )
    table = Table(show_header=True, header_style="bold", expand=False)
    for col in ("line", "stage", "became", "result in", "VGPRs live"):
        table.add_column(col)
    chunks = glsl_by_line(b.glsl)
    for p in k.phases:
        line = p.span.line_col()[0] if p.span.source is source else 0
        how, where = phase_kind(p)
        live = parts.by_line.get(line)
        # a stage of a stage group: its line in the group, then the uses it came through
        uses = p.span.via if line else ()
        label = " via ".join(str(s.line_col()[0]) for s in (p.span, *uses)) if line else "0"
        text = " ".join(source.line_text(line).split()) if line else ""
        if uses:
            text += f" (from {' '.join(source.line_text(uses[-1].line_col()[0]).split())})"
        table.add_row(
            label,
            text,
            how,
            where,
            "-" if live is None else str(live),
        )
    console.print(table)
    peak = f"peak {parts.demand.vgprs} VGPRs"
    if parts.peak_line is not None:
        peak += f" at line {parts.peak_line}"
    if parts.peak_values:
        counts: dict[str, int] = {}
        for v in parts.peak_values:
            counts[v] = counts.get(v, 0) + 1
        peak += " (live there: " + ", ".join(f"{n} {name}" for name, n in counts.items()) + ")"
    console.print(peak)
    for e in estimates:
        if e.target == target:
            console.print(
                f"estimate on {target} wave{e.wave}: {e.vgprs} VGPRs, {e.spills} spilled, "
                f"LDS {e.lds_bytes} B, {e.waves_per_simd} waves per SIMD"
                + (f"; uncertain: {e.uncertain}" if e.uncertain else "")
            )
    shown = set()
    for p in k.phases:
        line = p.span.line_col()[0] if p.span.source is source else 0
        if line in shown or line not in chunks:
            continue
        shown.add(line)
        code = chunks[line]
        more = len(code) - GLSL_LINES_SHOWN
        body = "\n".join(code[:GLSL_LINES_SHOWN]) + (
            f"\n// ... {more} more line(s)" if more > 0 else ""
        )
        console.print(Text(f"GLSL of line {line}:", style="dim"))
        console.print(Syntax(body, "glsl", theme="ansi_dark", line_numbers=False, word_wrap=True))


def explain(
    console: Console, result: BuildResult, region_name: str, target: str, path: str
) -> None:
    region = next(r for r in result.program.regions if r.name == region_name)
    data = result.manifest.region(region_name)
    assert data is not None  # the manifest lists every region the build was given
    source = region.span.source
    sources = {path: source}
    built = {b.kernel.name: b for b in result.kernels}
    shown = f", instance {region.instance.display}" if region.instance is not None else ""
    console.print(Text(f"region {region_name} ({path}:{region.span.line_col()[0]}{shown})", "bold"))
    for v in sorted((v for v in data.verdicts if v.target == target), key=lambda v: v.wave):
        state = "fused" if v.accepted else "unfused"
        console.print(f"  {target} wave{v.wave}: runs {state}: {v.reason}")
    for title, products in (
        ("fused product", data.fused),
        ("fused product, lanes exchanging through shared memory", data.fused_shared),
        ("unfused chain", data.unfused),
    ):
        if not products:
            continue
        console.rule(f"{title}: {len(products)} kernel(s)")
        for k in products:
            _kernel_report(console, built[k.name], source, k.estimates, target, sources)
    # stages no kernel computes on their own line: indexed register stages substituted into
    # their readers (in every product, for one computed `as f64`)
    own = {
        p.span.line_col()[0]
        for b in built.values()
        if b.kernel.name.split(".")[0] == region_name
        for p in b.kernel.phases
        if p.span.source is source
    }
    for st in region.all_stages():
        line = st.span.line_col()[0]
        if line not in own:
            console.print(
                f"line {line}: '{st.name}' has no code of its own; "
                "it is recomputed in each stage that reads it"
            )


def cmd_explain(args: Any, read: Any, targets: Sequence[str]) -> int:
    """The `explain` command (runtime/cli.py wires it): build the file, explain one region."""
    from fusec.codegen.build import build_source
    from fusec.dsl.region_names import resolve_regions, with_variants

    text = read(args.file)
    # only the region explained is built; `R<q4_0>` names an instance (dsl/region_names.py)
    result = build_source(text, args.file, tuple(targets), regions=(args.region,), variants=True)
    (region,) = resolve_regions(result.program.regions, (args.region,), args.file)
    target = targets[0] if targets else "gfx1201"
    console = Console(highlight=False, soft_wrap=False, width=args.width)
    # what runs on the target is the region's variant for it, where the file has one
    variant = with_variants(result.program.regions, (region,), (target,))[1:]
    if variant:
        console.print(
            f"on {target}, {args.region} runs as its variant {variant[0]} "
            f"(its `schedule on {target}` lines); explained below"
        )
        region = variant[0]
    explain(console, result, region, target, args.file)
    return 0
