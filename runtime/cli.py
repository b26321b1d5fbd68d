"""The `fusec` command: build, check, demo.

Diagnostics go to stderr as `FILE:LINE:COL: error: ...` (or `fusec: error: ...`), exit 1.
`build` imports the compiler only when called, so `check DIR` runs on a machine without shaderc.
"""

from __future__ import annotations

import argparse
import errno
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fusec.codegen import manifest_records as mr
from fusec.dsl.diagnostics import Diagnostic, DiagnosticError

from . import export, fmt_cmd, tune_cmd
from .device import Device, RuntimeFailure
from .spirv_spec import SWITCH as SPEC_SWITCH
from .spirv_spec import spec_mode


def _fail(message: str, hint: str | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(None, message, hint)])


def _read(path: str) -> str:
    from fusec.dsl.source_file import read_source

    return read_source(path)


def _targets(targets: Sequence[str]) -> tuple[str, ...]:
    from fusec.codegen.targets import TARGETS

    for t in targets:
        if t not in TARGETS:
            raise _fail(f"unknown target '{t}'", "known targets: " + ", ".join(TARGETS))
    return tuple(dict.fromkeys(targets))


def _consts(items: Sequence[str]) -> dict[str, int | float]:
    out: dict[str, int | float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if name.strip() in out:
            raise _fail(f"--const {name.strip()} is given twice", "give each constant one --const")
        try:
            if not sep or not value.isascii():
                raise ValueError  # int() and float() read other scripts' digits too
            try:
                out[name.strip()] = int(value)
            except ValueError:
                # 1e3, 0.5, inf, nan: const_values refuses what does not fit the constant
                out[name.strip()] = float(value)
        except ValueError:
            raise _fail(f"--const takes NAME=VALUE, not '{item}'", "e.g. --const K=1000") from None
    return out


def cmd_build(args: argparse.Namespace) -> int:
    from fusec.codegen.build import build_source, up_to_date, write_build
    from fusec.codegen.folder import check_destination

    t0 = time.perf_counter()
    text = _read(args.file)
    targets = _targets(args.target)
    if args.dump is not None:
        from fusec.codegen.dump import dump_source

        sys.stdout.write(dump_source(text, args.file, args.dump, targets, tuple(args.region)))
        return 0
    if args.region:
        raise _fail("--region selects what --dump prints", "fusec build FILE --dump kir --region R")
    if args.stamps and not args.persistent:
        raise _fail(
            "--stamps adds stamps to the persistent products, and none is asked for",
            "fusec build kernels.fuse -o DIR --persistent PRESET --stamps",
        )
    if args.persistent:
        from fusec.runtime import decode_layer as layer

        for p in args.persistent:
            if p not in layer.PRESETS:
                raise _fail(f"unknown preset '{p}'", "presets: " + ", ".join(layer.PRESETS))
    check_destination(Path(args.output))  # before compiling: refuse a folder we may not replace
    current = None if args.force else up_to_date(text, args.file, targets, Path(args.output))
    if current is not None:
        regions = current.regions
        n = sum(len(list(r.kernels())) for r in regions)
        print(
            f"fusec: {args.output}/ is up to date ({len(regions)} region(s), {n} kernel(s), "
            f"checked in {time.perf_counter() - t0:.2f} s; --force rebuilds)"
        )
    else:
        result = build_source(text, args.file, targets, cache_dir=args.output)
        if args.persistent:  # before the folder is written: DIR stays as it was on refusal
            _layer_regions_present(result.manifest, args.persistent)
        out = write_build(result, args.output)
        n = len(result.kernels)
        print(
            f"fusec: built {len(result.program.regions)} region(s), {n} kernel(s) in "
            f"{result.seconds:.2f} s -> {out}/ (compiler: {result.manifest.compiler})"
        )
    if args.persistent:
        if current is not None:
            _layer_regions_present(current, args.persistent)
        _build_persistent(Path(args.output), args.persistent, args.stamps)
    return 0


def _layer_regions_present(manifest: Any, presets: Sequence[str]) -> None:
    """Refuse `--persistent` for a build that lacks a region the decode layer calls, for any
    weight dtype and target (one sentence, before anything is written)."""
    from fusec.codegen.targets import TARGETS

    from . import decode_layer as layer

    for name in presets:
        for wdtype in layer.WEIGHT_DTYPES:
            for tname in [*TARGETS, None]:
                try:
                    layer.calls(layer.PRESETS[name], wdtype, regions=manifest, target=tname)
                except (KeyError, RuntimeFailure) as e:
                    why = str(e).strip("'\"").splitlines()[0].removeprefix("fusec: error: ")
                    raise _fail(
                        f"--persistent needs the decode layer's regions, and this build lacks "
                        f"one ({why})",
                        "build kernels.fuse for --persistent",
                    ) from None


def _build_persistent(folder: Path, presets: Sequence[str], stamps: bool) -> None:
    """`fusec build ... --persistent PRESET`: the layer's persistent products into the folder
    (runtime/persistent_aot.py)."""
    from .persistent_aot import PRODUCTS, build_products

    t0 = time.perf_counter()
    try:
        built = build_products(folder, presets, stamps=stamps)
    except (KeyError, RuntimeFailure) as e:
        raise _fail(
            f"the decode layer's regions are not all in this build ({e})",
            "build kernels.fuse for --persistent",
        ) from None
    print(
        f"fusec: {len(built)} persistent product(s) of {', '.join(presets)} in "
        f"{time.perf_counter() - t0:.2f} s -> {folder}/{PRODUCTS}/"
    )


def _is_build_path(path: str) -> bool:
    p = Path(path)
    try:
        return p.is_dir() or p.name == "manifest.json"
    except OSError:  # a name too long for the file system: reading it says so
        return False


def _cached(
    path: str, targets: tuple[str, ...] = (), regions: tuple[str, ...] = (), variants: bool = False
) -> tuple[Any, Any]:
    """(Build, BuildResult or None) for a `.fuse` file, compiled into the user's cache folder
    (dsl.cachedir.cache_root), never into the working directory; `regions`: only those.  A
    cached build that no longer validates is compiled again."""
    from fusec.codegen.build import cached_build

    from .dispatch import Build

    text = _read(path)
    out, result = cached_build(text, path, targets, regions, variants)
    try:
        return Build.load(out), result
    except DiagnosticError:
        if result is not None:
            raise
    shutil.rmtree(out, ignore_errors=True)  # a damaged cache entry: ours to replace
    out, result = cached_build(text, path, targets, regions, variants)
    return Build.load(out), result


def _load_for_check(path: str, regions: tuple[str, ...] = ()) -> tuple[Any, Any]:
    """(Build, ir.Program) from a .fuse file (only `regions` compiled, into the cache) or a
    build folder (its source checked again with the options its build recorded)."""
    from fusec.codegen.build import check_source

    from .dispatch import Build

    if _is_build_path(path):
        build = Build.load(Path(path))
        copy = build.path / build.manifest.source_copy
        targets = build.manifest.options.targets
        program = check_source(_read(str(copy)), build.manifest.source, targets)
        build.check_program(program)
        return build, program
    build, result = _cached(path, regions=regions)
    if result is not None:
        return build, result.program
    program = check_source(_read(path), path)
    build.check_program(program)
    return build, program


def _selected(program: Any, names: Sequence[str], given: str) -> list[Any]:
    """The regions of `names` (all when none), by name or display name; a name of no region
    is a diagnostic naming what was `given` (a build folder, or the source file)."""
    from fusec.dsl.region_names import resolve_regions  # an instance by its display name too

    where = f"build folder {given}" if _is_build_path(given) else program.path
    known = {r.name: r for r in program.regions}
    return [known[n] for n in resolve_regions(program.regions, names, where)] or list(
        program.regions
    )


def _fmt_err(e: float) -> str:
    return "inf" if e == float("inf") else f"{e:.2e}"


def _fmt_tol(tol: float, precision: str) -> str:
    """`tol 0.0001, f32`, or `exact` for an integer output (tolerance 0)."""
    return "exact" if tol == 0 else f"tol {tol:g}, {precision}"


def cmd_check(args: argparse.Namespace) -> int:
    from .verify import SEED_MAX, check_region, param_points, select_consts, worst_of

    consts = _consts(args.const)
    build, program = _load_for_check(args.file, tuple(args.region))
    # a build of some regions only (`check FILE --region`, or a folder built so) checks those
    built = [r.name for r in build.manifest.regions]
    regions = _selected(program, args.region or built, args.file)
    build.verify([r.name for r in regions])  # spirv-val, before any device work
    spec_note = _spec_note()  # FUSEC_SPEC_CONSTANTS, refused before any device work
    failed = 0
    with Device(args.device, robust=True) as dev:
        # names, values and sizes of every region refused before any output
        by_region = select_consts(build, regions, consts, dev)
        print(
            f"device: {dev.info.name} ({dev.info.kind}, subgroup {dev.info.subgroup_size})"
            + spec_note
        )
        for r in regions:
            # run-time params not set with --const: at several points of their range
            points = param_points(build, r, by_region[r.name])
            reps = [
                check_region(
                    dev,
                    build,
                    r,
                    {**by_region[r.name], **point},
                    None if args.seed is None else (args.seed + i) % (SEED_MAX + 1),
                    args.target,
                    args.min_waves,
                    allow_nonfinite=args.allow_nonfinite,
                )
                for point in points
                for i in range(args.draws)
            ]
            rep = worst_of(reps)
            if len(points) > 1:
                shown_points = "; ".join(
                    ", ".join(
                        f"{k}={v}" if isinstance(v, int) else f"{k}={v:g}" for k, v in p.items()
                    )
                    for p in points
                )
                print(f"{r.name}: run-time params checked at {shown_points}; the worst follows")
            shown = ", ".join(f"{k}={v}" for k, v in rep.consts.items())
            print(
                f"{rep.region} [{shown}]: {rep.path}; fused {rep.fused_dispatches} "
                f"dispatch(es), {rep.fused_barriers} barrier(s); unfused "
                f"{rep.unfused_dispatches} dispatch(es), {rep.unfused_barriers} barrier(s); "
                f"subgroup {'/'.join(map(str, rep.subgroup_sizes))}"
            )
            for c in rep.driver:
                print(f"  driver: {c.summary()}")
            for o in rep.outputs:
                verdict = "ok" if o.ok else "MISMATCH"
                margin = ""
                if args.draws > 1:
                    margin = (
                        f"; worst of {args.draws} draws"
                        if o.tolerance == 0
                        else f"; worst of {args.draws} draws, {o.used:.3f} of the tolerance"
                    )
                print(
                    f"  {o.name}: max rel err fused {_fmt_err(o.fused_error)}, unfused "
                    f"{_fmt_err(o.unfused_error)} "
                    f"({_fmt_tol(o.tolerance, o.basis or rep.precision)}) "
                    f"{verdict}{margin}"
                )
                if (
                    not o.ok
                    and o.reference_nans
                    and math.isinf(max(o.fused_error, o.unfused_error))
                ):
                    failed += 1
                    n = o.reference_nans
                    print(
                        f"fusec: error: output '{o.name}' of region '{rep.region}': the "
                        f"reference itself computes {n} NaN value{'s' if n > 1 else ''} from "
                        "finite inputs (0 / 0, the root, logarithm or pow of a negative), so the "
                        "kernels' outputs cannot be measured against it there\n"
                        "  hint: fix the region, or pass --allow-nonfinite to take NaN where "
                        "the reference has NaN as agreeing",
                        file=sys.stderr,
                    )
                elif not o.ok:
                    failed += 1
                    worst = max(o.fused_error, o.unfused_error)
                    which = "fused" if o.fused_error > o.tolerance else "unfused"
                    by = (
                        f" by {_fmt_err(worst)}, tolerance {o.tolerance:g}"
                        if o.tolerance
                        else ", which an integer output must match exactly"
                    )
                    print(
                        f"fusec: error: output '{o.name}' of region '{rep.region}' "
                        f"({which}) differs from the reference{by}",
                        file=sys.stderr,
                    )
    return 1 if failed else 0


def _budget_summary(region: mr.Region) -> str:
    """'accepted' or the targets and waves where the fused product is refused, with a reason."""
    refused = [(v.target, v.wave, v.reason) for v in region.verdicts if not v.accepted]
    if not refused:
        return "accepted everywhere"
    t, w, why = refused[0]
    more = f" (+{len(refused) - 1} more)" if len(refused) > 1 else ""
    return f"refused on {t} wave{w}{more}: {why}"


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from fusec.codegen.build import build_source, write_build

    from .dispatch import Build
    from .verify import check_region

    console = Console(width=None if sys.stdout.isatty() else 160)
    t0 = time.perf_counter()
    result = build_source(_read(args.file), args.file)
    write_build(result, args.output)
    build_s = time.perf_counter() - t0
    console.print(
        f"[bold]fusec build {args.file}[/]: {len(result.program.regions)} regions, "
        f"{len(result.kernels)} kernels in [bold]{build_s:.2f} s[/] "
        f"(compiler: {result.manifest.compiler}) -> {args.output}/"
    )
    build = Build.load(args.output)
    table = Table(title="fusec demo: fused vs unfused vs numpy reference")
    for col in (
        "region",
        "path",
        "dispatches f/u",
        "barriers f/u",
        "subgroup",
        "output",
        "rel err fused",
        "rel err unfused",
        "tol",
        "verdict",
        "budget (6 targets)",
    ):
        table.add_column(col)
    failed = 0
    with Device(args.device, robust=True) as dev:
        console.print(f"device: {dev.info.name} ({dev.info.kind})")
        for r in result.program.regions:
            rep = check_region(dev, build, r, None, args.seed)
            for i, o in enumerate(rep.outputs):
                failed += not o.ok
                table.add_row(
                    rep.region if i == 0 else "",
                    rep.path if i == 0 else "",
                    f"{rep.fused_dispatches}/{rep.unfused_dispatches}",
                    f"{rep.fused_barriers}/{rep.unfused_barriers}",
                    "/".join(map(str, rep.subgroup_sizes)),
                    o.name,
                    _fmt_err(o.fused_error),
                    _fmt_err(o.unfused_error),
                    f"{o.tolerance:g}",
                    "[green]ok[/]" if o.ok else "[red]MISMATCH[/]",
                    _budget_summary(build.region(r.name)) if i == 0 else "",
                )
    console.print(table)
    console.print(
        f"build time: {build_s:.2f} s; "
        + ("every region verified" if not failed else f"{failed} output(s) mismatched")
    )
    return 1 if failed else 0


def _occupancy_rows(
    manifest: mr.Manifest,
    out_dir: Path,
    targets: tuple[str, ...],
    min_waves: int | None,
    regions: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """A row per kernel, target and wave size of the manifest's regions (`regions` only, when
    given)."""
    from fusec.codegen.budget import budget_for, capability_refusal, judge
    from fusec.codegen.targets import TARGETS
    from fusec.dsl.region_names import variant_of

    rows = []
    for region in manifest.regions:
        if regions and region.name not in regions:
            continue
        # a target variant (`R__sm90`) runs on its target only: its rows are that target's
        own = variant_of(region)
        fused = region.fused
        named = [("fused" if len(fused) == 1 else f"fused.{i}", k) for i, k in enumerate(fused)]
        named += [(f"unfused.{i}", k) for i, k in enumerate(region.unfused)]
        for label, k in named:
            for est in k.estimates:
                if targets and est.target not in targets:
                    continue
                if own is not None and est.target != own[1]:
                    continue
                budget = budget_for(est.target, region.budget, min_waves)
                lacks = capability_refusal(TARGETS[est.target], k, est.lds_bytes, est.wave)
                if lacks is not None:
                    ok, reason = False, f"{est.target}: {k.name}: {lacks}"
                else:
                    ok, reason = judge(est.target, est.wave, est, budget)
                rows.append(
                    {
                        "region": region.name,
                        "kernel": label,
                        "target": est.target,
                        "wave": est.wave,
                        "spv": str(out_dir / k.spv),
                        "vgprs": est.vgprs,
                        "sgprs": est.sgprs,
                        "lds_bytes": est.lds_bytes,
                        "spills": est.spills,
                        "waves_per_simd": est.waves_per_simd,
                        "accepted": ok,
                        "reason": reason,
                        "_name": k.name,
                        "_workgroup": k.workgroup_size,
                    }
                )
    return rows


def _add_actual(rows: list[dict[str, Any]], out_dir: Path) -> list[str]:
    """Fill actual_* fields from drivers; returns notes about targets with no statistics and
    kernels the driver was not given (a feature the device lacks)."""
    from fusec.codegen.targets import TARGETS

    from .actual import radv_env, run_worker
    from .gate import driver_numbers

    out_dir = out_dir.resolve()  # the worker runs in the repository root
    notes = []
    for target in dict.fromkeys(r["target"] for r in rows):
        t = TARGETS[target]
        if t.vendor == "amd":
            env = radv_env(target)
            if env is None:
                notes.append(
                    f"no statistics for {target}: RADV (mesa-vulkan-drivers) is not installed; "
                    "showing estimates only for it"
                )
                continue
            results, why = run_worker(out_dir, list(t.wave_sizes), env)
        else:
            results, why = run_worker(out_dir, list(t.wave_sizes), None)
            if results and not any("Register Count" in r.get("stats", {}) for r in results):
                present = results[0]["device"]
                results, why = None, f"the device present ({present}) is not {target}"
        if results is None:
            notes.append(f"no statistics for {target}: {why}; showing estimates only for it")
            continue
        for r in results:
            if "refused" in r:
                notes.append(f"{target}: {r['kernel']} not compiled: {r['refused']}")
        by_key = {(r["kernel"], r["wave"]): r["stats"] for r in results if "stats" in r}
        for row in rows:
            st = by_key.get((row["_name"], row["wave"])) if row["target"] == target else None
            numbers = None if st is None else driver_numbers(t, row["wave"], st, row["_workgroup"])
            if st is None or numbers is None:
                continue
            driver, allocated = numbers
            row.update(
                {
                    "actual_vgprs": allocated,
                    "actual_presched_vgprs": (
                        int(st["Pre-Sched VGPRs"]) if "Pre-Sched VGPRs" in st else None
                    ),
                    "actual_spills": driver.spills,
                    "actual_lds_bytes": driver.lds_bytes,
                    "actual_waves_per_simd": driver.waves_per_simd,
                }
            )
    return notes


def cmd_explain(args: argparse.Namespace) -> int:
    from .explain import cmd_explain as explain

    return explain(args, _read, _targets(args.target))


def cmd_occupancy(args: argparse.Namespace) -> int:
    import json

    from fusec.dsl.region_names import resolve_regions, with_variants

    from .dispatch import Build

    targets = _targets(args.target)
    if args.plot and args.html and os.path.realpath(args.plot) == os.path.realpath(args.html):
        # refused before anything is written (the page would refuse the plot just written)
        raise _fail(f"--plot and --html name the same file {args.plot}", "give each its own")
    regions = tuple(args.region)  # only these are compiled (all when none is named)
    if _is_build_path(args.file):
        # a prebuilt folder: no compiler needed (the H200 machine has none)
        build = Build.load(Path(args.file))
    elif args.output is not None:
        from fusec.codegen.build import build_source, write_build
        from fusec.codegen.folder import check_destination

        check_destination(Path(args.output))
        result = build_source(
            _read(args.file),
            args.file,
            targets,
            cache_dir=args.output,
            regions=regions,
            variants=True,  # what runs on each target: the rows show it
        )
        build = Build.load(write_build(result, args.output))
    else:
        build, _ = _cached(args.file, targets, regions, variants=True)
    out, data = build.path, build.manifest
    # a region's name or an instance's display name (`gated_ffn<q4_0>`); a prebuilt folder
    # holds more regions than those named, so the rows are those of the names
    names = resolve_regions(data.regions, args.region, args.file)
    # a region's rows include its target variants' (`R__sm90`), which run on those targets
    names = with_variants(data.regions, names, targets)
    rows = _occupancy_rows(data, out, targets, args.min_waves, names)
    notes = _add_actual(rows, out) if args.actual else []
    for n in notes:
        print(f"fusec: note: {n}", file=sys.stderr)
    public = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]
    if args.plot or args.html:
        from .plot import write_html, write_png

        if args.plot:
            write_png(rows, args.plot, args.file, args.region, args.min_waves)
        if args.html:
            write_html(rows, args.html, args.file, args.region, args.min_waves)
    if args.json:
        print(json.dumps(public, indent=1))
        return 0
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # "actual" only for numbers a driver gave: --actual was asked for and some came back
    if any("actual_vgprs" in r for r in rows):
        measured = "estimated; actual from the driver"
    elif args.actual:
        measured = "estimated; no driver statistics"
    else:
        measured = "estimated"
    table = Table(title=f"fusec occupancy {escape(args.file)} ({measured})")
    cols = [
        "region",
        "kernel",
        "target",
        "wave",
        "vgprs",
        "sgprs",
        "lds_bytes",
        "spills",
        "waves_per_simd",
        "accepted",
        "reason",
    ]
    if args.actual:
        cols[5:5] = ["actual_presched_vgprs", "actual_vgprs"]
        cols[-2:-2] = ["actual_spills", "actual_waves_per_simd"]
    for c in cols:
        # a reason is never cut short: it names the target, kernel and capability or budget
        table.add_column(
            c.replace("actual_", "act_").replace("_per_simd", "/simd"),
            overflow="fold" if c in ("region", "reason") else "ellipsis",
        )
    for r in public:
        table.add_row(*["-" if r.get(c) is None else str(r.get(c)) for c in cols])
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0


def _gbs(value: float) -> str:
    """GB/s for a table: whole numbers on a GPU, two significant digits on a CPU device (a
    lavapipe run reads 0.09, not 0)."""
    return f"{value:.0f}" if value >= 10 else f"{value:.2g}"


def _bench_layer(
    args: argparse.Namespace, dev: Device, build: Any, copy_gbs: float, file_layer: Any
) -> Any:
    """Time the decode layer (fusec.runtime.decode_layer) fused and unfused, after checking
    both against the numpy layer; `file_layer`: the layer read from --gguf, or None."""
    import numpy as np

    from fusec.runtime import decode_layer as layer

    from .step import (
        Step,
        StepBuffers,
        decode_tokens,
        errors_from,
        median,
        step_buffers,
        time_steps,
    )

    spec_mode()  # FUSEC_SPEC_CONSTANTS, refused before the layer is generated
    name = args.preset or ("tiny" if dev.info.kind == "CPU" else "qwen3-8b")
    preset, wdtype = layer.PRESETS[name], args.weights or "f16"
    if args.splits is not None:
        if not 1 <= args.splits <= preset.context:
            raise _fail(
                f"--splits {args.splits}: the runs of the cache must number 1 to its "
                f"{preset.context} rows"
            )
        import attrs

        preset = attrs.evolve(preset, splits=args.splits)
    rng = np.random.default_rng(args.seed)
    if file_layer is not None:
        from fusec.runtime import gguf_layer

        file_layer = file_layer.with_cache(preset.context, preset.splits)
        preset, wdtype, name = file_layer.preset, file_layer.wdtype, file_layer.preset.name
        print(f"layer {name} ({file_layer.architecture}), {wdtype} weights", file=sys.stderr)
        arrays = gguf_layer.state(file_layer, rng)
    else:
        print(f"layer {name}, {wdtype} weights: generating and uploading", file=sys.stderr)
        arrays = layer.random_state(preset, wdtype, rng)
    if args.qkv_epilogue and wdtype not in layer.QKV_EPILOGUE_REGIONS:
        raise _fail(
            f"--qkv-epilogue has a region for {', '.join(layer.QKV_EPILOGUE_REGIONS)} weights "
            f"only, not {wdtype}"
        )
    if args.q8_inputs and wdtype not in layer.Q8_INPUT_REGIONS:
        raise _fail(
            f"--q8-inputs has regions for {', '.join(layer.Q8_INPUT_REGIONS)} weights only, "
            f"not {wdtype}"
        )
    from fusec.codegen.targets import target_for_device

    target = target_for_device(dev.info.name)
    calls = layer.calls(
        preset,
        wdtype,
        qkv_epilogue=args.qkv_epilogue or None,
        gqa_split=args.gqa_split or None,
        q8_inputs=args.q8_inputs or None,
        regions=build.manifest,  # each projection's instance, for the weights' dtypes
        target=target.name if target is not None else None,
    )
    weights = layer.weight_values(arrays, preset, wdtype)
    decls = step_buffers(build, calls)
    bufs = StepBuffers(dev, decls)
    steps: list[Step] = []
    try:
        bufs.upload(arrays)
        steps = [Step(dev, build, calls, bufs, fused) for fused in (True, False)]
        pos = preset.context - 1  # the full context
        # numpy's layer, and the answers that round values near a q8_0 tie the other way
        answers = layer.Answers(preset, arrays, weights, pos, wdtype)
        errors = {}

        def check(step: Step, run: Any, when: str) -> dict[str, float]:
            """The step's results against numpy; refused in one sentence off tolerance."""
            tol = layer.TOLERANCE[wdtype]
            errs = errors_from(step, bufs, arrays, answers, tol, run)
            if any(e > tol for e in errs.values()):
                raise _fail(
                    f"the {name} layer ({'fused' if step.fused else 'unfused'}) does not match "
                    f"the numpy layer {when} ({errs})"
                )
            return errs

        for step in steps:  # results checked before timing, from the same starting state
            errs = check(
                step,
                lambda step=step: decode_tokens(step, [pos], lambda p: None, lambda p: None),
                "before timing; not timing it",
            )
            errors["fused" if step.fused else "unfused"] = errs
        print("checked against numpy; timing", file=sys.stderr)
        # the timed recordings checked too, after the timing (each repeats the step at `pos`,
        # which leaves the same state): what was timed is what was checked
        t = time_steps(
            steps[0],
            steps[1],
            pos,
            args.reps,
            per_dispatch=args.per_dispatch,
            verify=lambda step, run: check(step, run, "in its timed recording; times discarded"),
        )
        persistent = None
        if args.persistent:  # the layer as one dispatch, timed beside the fused chain
            from .persistent import bench_persistent

            persistent = bench_persistent(
                dev, build, calls, bufs, arrays, answers, wdtype, steps[0], pos, args
            )
    finally:
        for step in steps:
            step.close()
        bufs.destroy()
    wb = sum(decls[w].nbytes for w in layer.WEIGHTS if w in decls)
    floor_us = wb / (copy_gbs * 1e9) * 1e6
    fused_us, unfused_us = median(t.fused_us), median(t.unfused_us)

    def product(report: Any, us: float, profile: Any) -> dict[str, Any]:
        return {
            "median_us": round(us, 2),
            "dispatches": report.dispatches,
            "barriers": report.barriers,
            "paths": [{"region": r, "path": p} for r, p in report.paths],
            **(
                {"per_dispatch": [{"kernel": k, "us": round(v, 2)} for k, v in profile]}
                if profile
                else {}
            ),
        }

    return {
        "device": dev.info.name,
        "preset": name,
        "weights": wdtype,
        "pos": pos,
        "splits": preset.splits,
        "fused": product(t.fused, fused_us, t.fused_profile),
        "unfused": product(t.unfused, unfused_us, t.unfused_profile),
        "weight_bytes": wb,
        # four significant digits: on a CPU device the probe reads a few GB/s, where one
        # decimal would leave floor_us (computed from the unrounded rate) a few % off it
        "copy_gbs": float(f"{copy_gbs:.4g}"),
        "floor_us": round(floor_us, 2),
        "speedup": round(unfused_us / fused_us, 3),
        "fused_over_floor": round(fused_us / floor_us, 3),
        "fused_gbs": round(wb / (fused_us * 1e3), 1),
        "errors": {k: {n: float(f"{e:.3g}") for n, e in v.items()} for k, v in errors.items()},
        "samples": len(t.fused_us),
        "spec_constants": spec_mode(),
        **({"persistent": persistent} if persistent is not None else {}),
    }


def _spec_note() -> str:
    """How the runtime hands kernels their specialization constants, where it is not the
    default (runtime/spirv_spec.py); the switch is parsed here, before any device work."""
    mode = spec_mode()
    return "" if mode == "pass" else f"; specialization constants: {mode} ({SPEC_SWITCH})"


def _print_layer(x: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"fusec bench: decode layer {x['preset']} ({x['weights']} weights, pos {x['pos']}) "
        f"on {x['device']}: median µs per layer (GPU timestamps)"
        + ("" if x["spec_constants"] == "pass" else f"; constants: {x['spec_constants']}")
    )
    for col in ("product", "µs", "dispatches", "barriers", "weights MB", "GB/s", "floor µs",
                "/ floor", "speedup"):  # fmt: skip
        table.add_column(col)
    wb = x["weight_bytes"]
    for label in ("fused", "unfused"):
        p = x[label]
        table.add_row(
            label,
            f"{p['median_us']:.1f}",
            str(p["dispatches"]),
            str(p["barriers"]),
            f"{wb / 1e6:.1f}",
            _gbs(wb / (p["median_us"] * 1e3)),
            f"{x['floor_us']:.1f}",
            f"{p['median_us'] / x['floor_us']:.2f}x",
            f"{x['speedup']:.2f}x" if label == "fused" else "",
        )
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    for item in x["fused"]["paths"]:
        console.print(f"  {item['region']}: {item['path']}")
    if "persistent" in x:
        p = x["persistent"]
        console.print(
            f"persistent ({p['product']}: {p['why']}): {p['median_us']:.1f} µs against the "
            f"fused chain's {p['fused_us']:.1f} µs timed beside it"
        )
        if "stamps" in p:
            _print_stamps(console, p["stamps"])
    for label in ("fused", "unfused"):
        if "per_dispatch" in x[label]:
            console.print(f"{label}, per dispatch (µs since the previous timestamp):")
            for d in x[label]["per_dispatch"]:
                console.print(f"  {d['us']:8.2f}  {d['kernel']}")


def _print_stamps(console: Any, st: dict[str, Any]) -> None:
    """The persistent product's per-stage stamps (runtime/persistent_stamps.py), or why there
    are none."""
    if not st["available"]:
        console.print(st["why"])
        return
    console.print(
        f"persistent, per stage (device clock, {st['ticks_per_us']:g} ticks/µs measured, spread "
        f"{st['ticks_per_us_spread']:.2%}; median of {st['runs']} stamped runs): kernel "
        f"{st['kernel_us']:.1f} µs of the dispatch's {st['dispatch_us']:.1f} µs; µs from the "
        "kernel's first stamp, an item's median length and its median wait for its ticket's "
        "dependencies"
    )
    console.print(
        f"  {'start':>9}  {'end':>9}  {'span':>9}  {'item':>8}  {'wait':>8}  items  stage"
    )
    for s in st["stages"]:
        console.print(
            f"  {s['start_us']:9.2f}  {s['end_us']:9.2f}  {s['span_us']:9.2f}  "
            f"{s['item_us']:8.2f}  {s['wait_us']:8.2f}  {s['items']:5d}  {s['stage']}"
        )


def cmd_bench(args: argparse.Namespace) -> int:
    import json

    import numpy as np

    from .timing import copy_bandwidth_gbs, time_region
    from .verify import check_region, random_inputs, select_consts

    if (args.preset or args.gguf or args.splits is not None) and (args.region or args.all_regions):
        raise _fail(
            "--preset, --gguf and --splits time the decode layer; leave out --region/--all-regions"
        )
    if args.gguf and args.weights:
        raise _fail("--gguf takes the weight type from the file; leave out --weights")
    if not (args.region or args.all_regions):
        file_layer = None
        if args.gguf:  # read first: a file that holds no such layer costs no build
            from fusec.runtime import gguf_layer

            try:
                file_layer = gguf_layer.load(args.gguf, args.layer)
            except gguf_layer.LayerFileError as exc:
                raise _fail(str(exc)) from None
        build, _ = _load_for_check(args.file)
        with Device(args.device) as dev:
            copy_gbs = copy_bandwidth_gbs(dev, size=args.copy_bytes)
            print(
                f"device: {dev.info.name}; copy bandwidth {copy_gbs:.0f} GB/s (read + write)",
                file=sys.stderr,
            )
            result = _bench_layer(args, dev, build, copy_gbs, file_layer)
        if args.json:
            print(json.dumps(result, indent=1))
        else:
            _print_layer(result)
        return 0
    consts = _consts(args.const)
    results = []
    build, program = _load_for_check(args.file)
    regions = _selected(program, args.region, args.file)
    with Device(args.device) as dev:
        copy_gbs = copy_bandwidth_gbs(dev, size=args.copy_bytes)
        print(
            f"device: {dev.info.name}; copy bandwidth {copy_gbs:.0f} GB/s (read + write)",
            file=sys.stderr,
        )
        by_region = select_consts(build, regions, consts, dev)
        for r in regions:
            rep = check_region(dev, build, r, by_region[r.name], args.seed)  # checked first
            if not rep.ok:
                raise _fail(f"region '{r.name}' does not match its reference; not timing it")
            region = build.region(r.name)
            inputs = random_inputs(region, rep.consts, np.random.default_rng(args.seed))
            # the copy probe again, right before the region: its floor from the same minute,
            # and the GPU's clocks back up after the seconds the reference check left it idle
            # (H200: a region timed after 3 s idle ran 31 us where it ran 9.75 straight after
            # another timing; short submissions alone never brought the clocks back)
            copy_gbs = copy_bandwidth_gbs(dev, size=args.copy_bytes)
            t = time_region(dev, build, r.name, inputs, rep.consts, args.reps, args.copies)
            profile = {}
            if args.per_dispatch:
                from .dispatch import RegionRunner
                from .timing import dispatch_profile

                runner = RegionRunner(dev, build, r.name, rep.consts)
                try:
                    for label, fused in (("fused", True), ("unfused", False)):
                        profile[label] = [
                            {"kernel": n, "us": round(us, 2)}
                            for n, us in dispatch_profile(runner, inputs, fused)
                        ]
                finally:
                    runner.close()
            floor_us = t.weight_bytes / (copy_gbs * 1e9) * 1e6 if t.weight_bytes else 0.0
            results.append(
                {
                    "region": r.name,
                    "device": dev.info.name,
                    "consts": t.consts,
                    "weight_bytes": t.weight_bytes,
                    "copies": t.copies,
                    # four significant digits: on a CPU device the probe reads a few GB/s, where one
                    # decimal would leave floor_us (computed from the unrounded rate) a few % off it
                    "copy_gbs": float(f"{copy_gbs:.4g}"),
                    "floor_us": round(floor_us, 2),
                    "fused": {
                        "path": t.fused.path,
                        "median_us": round(t.fused.median_us, 2),
                        "dispatches": t.fused.dispatches,
                        "barriers": t.fused.barriers,
                        "per_copy_us": [round(u, 2) for u in t.per_copy_us(t.fused)],
                    },
                    "unfused": {
                        "median_us": round(t.unfused.median_us, 2),
                        "dispatches": t.unfused.dispatches,
                        "barriers": t.unfused.barriers,
                        "per_copy_us": [round(u, 2) for u in t.per_copy_us(t.unfused)],
                    },
                    "speedup": round(t.unfused.median_us / t.fused.median_us, 3),
                    "fused_gbs": round(t.weight_bytes / (t.fused.median_us * 1e3), 1),
                    "fused_over_floor": round(t.fused.median_us / floor_us, 3)
                    if floor_us
                    else None,
                    **({"per_dispatch": profile} if profile else {}),
                }
            )
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title="fusec bench: median µs per step (GPU timestamps), fused vs unfused")
    for col in (
        "region",
        "path",
        "fused µs",
        "unfused µs",
        "speedup",
        "disp f/u",
        "barr f/u",
        "weights MB",
        "fused GB/s",
        "floor µs",
        "fused/floor",
    ):
        table.add_column(col)
    for x in results:
        table.add_row(
            x["region"],
            x["fused"]["path"],
            f"{x['fused']['median_us']:.1f}",
            f"{x['unfused']['median_us']:.1f}",
            f"{x['speedup']:.2f}x",
            f"{x['fused']['dispatches']}/{x['unfused']['dispatches']}",
            f"{x['fused']['barriers']}/{x['unfused']['barriers']}",
            f"{x['weight_bytes'] / 1e6:.1f}",
            _gbs(x["fused_gbs"]),
            # no weights, no floor: a dash, not a floor of 0 us and a ratio of 0.00x
            f"{x['floor_us']:.1f}" if x["weight_bytes"] else "-",
            "-" if x["fused_over_floor"] is None else f"{x['fused_over_floor']:.2f}x",
        )
    Console(width=None if sys.stdout.isatty() else 200).print(table)
    return 0


def _int_in(lo: int, hi: int) -> Any:
    """An argparse type: an integer from lo to hi (argparse reports anything else)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is not from {lo} to {hi}")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fusec",
        description="Kernel-fusion regions for LLM "
        "decode: .fuse -> SPIR-V + manifest, verified on Vulkan.",
    )
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="compile a .fuse file into SPIR-V + manifest.json")
    b.add_argument("file")
    b.add_argument("-o", "--output", default="build", help="output folder (default: build)")
    b.add_argument("--target", action="append", default=[], help="check limits of a target")
    b.add_argument(
        "--force", action="store_true", help="compile even when the folder is up to date"
    )
    b.add_argument(
        "--dump",
        choices=("kir", "glsl"),
        default=None,
        help="print the kernel IR or the GLSL of every kernel to stdout; compile and write nothing",
    )
    b.add_argument(
        "--region", action="append", default=[], help="with --dump: only this region (repeatable)"
    )
    b.add_argument(
        "--persistent",
        action="append",
        default=[],
        metavar="PRESET",
        help="also write the decode layer's persistent product of PRESET (docs/PERSISTENT.md; "
        "kernels.fuse), so that the runtime needs no compiler for it (repeatable)",
    )
    b.add_argument(
        "--stamps",
        action="store_true",
        help="with --persistent: also write each product with per-stage device-clock stamps "
        "(what fusec bench --persistent --per-dispatch runs)",
    )
    b.set_defaults(fn=cmd_build)
    c = sub.add_parser("check", help="run fused, unfused and reference; compare every output")
    c.add_argument("file", help="a .fuse file, or a build folder made by fusec build")
    c.add_argument("--region", action="append", default=[], help="only this region (repeatable)")
    c.add_argument(
        "--device",
        default=None,
        help="device name substring or index "
        "(default: $FUSEC_DEVICE, else the first GPU, else lavapipe)",
    )
    c.add_argument(
        "--const",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a constant or a run-time param, e.g. --const K=1000 or --const pos=4095 "
        "(repeatable; one not set takes its default)",
    )
    c.add_argument(
        "--seed",
        type=_int_in(0, 2**64 - 1),  # numpy's seeds (verify.SEED_MAX)
        default=None,
        help="random seed (default: fresh)",
    )
    c.add_argument(
        "--allow-nonfinite",
        action="store_true",
        help="run on inputs holding NaN or infinity (drawn from a value range beyond their "
        "dtype) instead of refusing them; NaN where the reference has NaN then counts as equal",
    )
    c.add_argument(
        "--draws",
        type=_int_in(1, 10000),
        default=1,
        help="check each region on this many draws of random inputs and report the worst "
        "error, as a fraction of the tolerance (finds inputs a region is ill-conditioned on); "
        "with --seed, draw i uses seed + i",
    )
    c.add_argument(
        "--target",
        default=None,
        help="gate the fused kernel on this target's "
        "budget (default: the device's own target, none for a CPU device)",
    )
    c.add_argument(
        "--min-waves",
        type=_int_in(1, 16),
        default=None,
        help="override the budget's minimum waves per SIMD for this call",
    )
    c.set_defaults(fn=cmd_check)
    o = sub.add_parser(
        "occupancy",
        help="estimated VGPRs, LDS, spills and waves per target, judged against the budget",
    )
    o.add_argument("file", help="a .fuse file, or a build folder (no compiler needed)")
    o.add_argument("--target", action="append", default=[], help="only this target (repeatable)")
    o.add_argument("--json", action="store_true", help="one JSON object per kernel and target")
    o.add_argument(
        "--actual",
        action="store_true",
        help="add the driver's numbers (RADV null "
        "device for AMD targets, the NVIDIA driver for sm90)",
    )
    o.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw waves against VGPRs per target: kernels at one point as one marker with a "
        "count, labels for refused, spilling and --region kernels",
    )
    o.add_argument(
        "--html",
        metavar="FILE.html",
        help="the same plot as one self-contained HTML page (inline SVG, kernels on hover)",
    )
    o.add_argument(
        "--region",
        action="append",
        default=[],
        help="only this region (repeatable): only its kernels are compiled, listed and "
        "plotted, each labelled on --plot/--html",
    )
    o.add_argument(
        "--min-waves", type=_int_in(1, 16), default=None, help="override the budget's minimum"
    )
    o.add_argument(
        "-o",
        "--output",
        default=None,
        help="also write the build folder here (default: a build in fusec's cache folder, "
        "$FUSEC_CACHE_DIR or $XDG_CACHE_HOME/fusec)",
    )
    o.set_defaults(fn=cmd_occupancy)
    bn = sub.add_parser(
        "bench",
        help="time the decode layer (default) or regions, fused vs unfused (GPU timestamps)",
    )
    bn.add_argument("file", help="a .fuse file, or a build folder (no compiler needed)")
    bn.add_argument(
        "--preset",
        choices=("tiny", "qwen3-8b"),
        default=None,
        help="decode-layer shapes (default: qwen3-8b on a GPU, tiny on a CPU device)",
    )
    bn.add_argument(
        "--weights",
        choices=("f16", "q8_0", "q4_0", "q4_K", "q4_k_m"),  # decode_layer.WEIGHT_DTYPES
        default=None,
        help="layer weight dtype (default f16; q4_k_m: q4_K, with q6_K for V and the FFN down "
        "projection, as llama.cpp's Q4_K_M; with --gguf, the file's)",
    )
    bn.add_argument(
        "--gguf",
        default=None,
        metavar="MODEL.gguf",
        help="time a layer of this GGUF model file: its shapes and weights (x and the caches "
        "stay random); --preset then sets only the cache rows and attention runs",
    )
    bn.add_argument(
        "--layer", type=_int_in(0, 65535), default=0, help="the layer of --gguf (default 0)"
    )
    bn.add_argument(
        "--qkv-epilogue",
        action="store_true",
        help="run the layer's QKV projection with RoPE and the cache writes in its epilogue "
        "(qkv_rope_kv, one kernel; f16 weights) instead of rms_norm_mul_matvec + rope_kv_store "
        "(the default is decode_layer.QKV_EPILOGUE)",
    )
    bn.add_argument(
        "--splits",
        type=int,
        default=None,
        metavar="N",
        help="run the layer's attention over N runs of the cache per head (its split kernels' "
        "NS; default: the preset's, 16 for qwen3-8b)",
    )
    bn.add_argument(
        "--gqa-split",
        action="store_true",
        help="run the layer's attention with a workgroup per key/value head and run "
        "(attention_split_gqa: each cache row loaded once per group of query heads) instead of "
        "attention_split (the default is decode_layer.GQA_SPLIT)",
    )
    bn.add_argument(
        "--q8-inputs",
        action="store_true",
        help="have the FFN write its output as q8_0 blocks (rms_norm_gated_ffn_q8out_*) and the "
        "down projection read them from global memory (matvec_add_q8in_*; q4_0, q4_K, q4_k_m "
        "weights) instead of each down-projection workgroup rounding its input (the "
        "default is decode_layer.Q8_INPUTS)",
    )
    bn.add_argument(
        "--persistent",
        action="store_true",
        help="also time the layer as one dispatch (the persistent product, runtime/persistent.py; "
        "its grid: FUSEC_PERSISTENT_WORKGROUPS or the estimate's) beside the fused chain",
    )
    bn.add_argument("--region", action="append", default=[], help="time this region instead")
    bn.add_argument("--all-regions", action="store_true", help="time every region of the file")
    bn.add_argument("--device", default=None)
    bn.add_argument(
        "--const",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a constant or a run-time param of the timed regions (repeatable)",
    )
    bn.add_argument(
        "--reps", type=_int_in(1, 100000), default=50, help="steps per submission (default 50)"
    )
    bn.add_argument(
        "--copies",
        type=_int_in(1, 64),
        default=None,
        help="weight copies to rotate (default: enough to exceed a 60 MiB L2)",
    )
    bn.add_argument(
        "--copy-bytes",
        type=_int_in(1 << 16, 1 << 34),
        default=None,
        help="size of the bandwidth probe copy (default 1 GiB; 64 MiB on a CPU device, whose "
        "rate is only a scale)",
    )
    bn.add_argument("--seed", type=_int_in(0, 2**64 - 1), default=None)  # verify.SEED_MAX
    bn.add_argument("--json", action="store_true")
    bn.add_argument(
        "--per-dispatch",
        action="store_true",
        help="also time each dispatch (a timestamp after each one; barrier waits included); "
        "with --persistent, per-stage device-clock stamps inside the product where the device "
        "has shaderDeviceClock (docs/PERSISTENT.md)",
    )
    bn.set_defaults(fn=cmd_bench)
    x = sub.add_parser(
        "explain",
        help="what each stage of a region became: kernels, phases, layouts, registers, GLSL",
    )
    x.add_argument("file")
    x.add_argument("--region", required=True, help="the region to explain")
    x.add_argument(
        "--target", action="append", default=[], help="the estimate's target (default gfx1201)"
    )
    x.add_argument("--width", type=_int_in(40, 400), default=None, help="terminal columns")
    x.set_defaults(fn=cmd_explain)
    fm = sub.add_parser("fmt", help="print a .fuse file in its canonical layout (--check, --write)")
    fmt_cmd.add_arguments(fm)
    fm.set_defaults(fn=fmt_cmd.cmd_fmt)
    tn = sub.add_parser(
        "tune", help="time (or rank) a region's schedules under the budget; --write the winner"
    )
    tune_cmd.add_arguments(tn)
    tn.set_defaults(fn=tune_cmd.cmd_tune)
    ex = sub.add_parser("export", help="write a build folder as one C header for an engine")
    export.add_arguments(ex)
    ex.set_defaults(fn=export.cmd_export)
    d = sub.add_parser("demo", help="build a file, verify every region, print a table")
    d.add_argument("file", nargs="?", default="kernels.fuse")
    d.add_argument("-o", "--output", default="build")
    d.add_argument("--device", default=None)
    d.add_argument("--seed", type=_int_in(0, 2**64 - 1), default=None)  # verify.SEED_MAX
    d.set_defaults(fn=cmd_demo)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except DiagnosticError as exc:
        print(exc.render(), file=sys.stderr)
        return 1
    except BrokenPipeError:  # `fusec check ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except KeyboardInterrupt:
        print("fusec: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] == "fusec":
            return _internal_error()
        # a dependency missing from this Python (run with another interpreter than the one
        # fusec was installed into): the environment's problem, not a bug of ours
        print(
            f"fusec: error: the Python package '{exc.name.split('.')[0]}' is not installed in "
            f"{sys.executable}; fusec needs it\n  hint: run fusec with the Python it was "
            "installed into (in a checkout, after `make setup`: .venv/bin/fusec), or install "
            "fusec into this one",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            return _internal_error()
        # a path the file system refuses by its length, wherever it was first touched
        name = str(exc.filename or "")
        shown = name if len(name) <= 80 else name[:77] + "..."
        print(f"fusec: error: cannot use {shown}: its name is too long", file=sys.stderr)
        return 1
    except Exception:
        return _internal_error()


def _internal_error() -> int:
    """Our bug: say so in one line, keep the details in a file."""
    log = Path(tempfile.gettempdir()) / f"fusec-crash-{os.getpid()}.txt"
    log.write_text(traceback.format_exc())
    print(f"fusec: internal error (a bug in fusec); details in {log}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
