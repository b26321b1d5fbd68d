"""`fusec tune FILE --region R [--target T]`: the fastest schedule of one region under the budget.

1. The region's schedules are enumerated (runtime/tune.py): workgroup size, rows per subgroup,
   each contraction's rows unit and vector width; today's schedule is the baseline.
2. Each is built and judged (runtime/tune_build.py): the checker's refusals, the budget gate's
   and duplicates are dropped and counted.
3. With the target's hardware present (no `--target`, or the device's own), the rest are
   verified against the numpy reference and timed side by side (runtime/tune_time.py): each
   candidate's median and its ratio to the baseline.  Without it, they are ranked by the
   estimator and ACO's statistics (runtime/tune_rank.py), and the output says so, and why.
4. `--write` writes the winner's launch and layout clauses into FILE, atomically, only when they
   differ from the file's and only when FILE did not change since it was read.

Bad input (an unknown region or target, a malformed option, no candidate left) is one sentence
on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fusec.dsl.diagnostics import Diagnostic, DiagnosticError
from fusec.dsl.source_file import Stored

from .fmt_cmd import _read, _write_atomically

if TYPE_CHECKING:  # the tuner itself (and the parser) load when `fusec tune` runs
    from .tune import Schedule, Subject


def _fail(message: str, hint: str | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(None, message, hint)])


def _ints(text: str) -> tuple[int, ...]:
    try:
        if not text.isascii():
            raise ValueError  # int() reads other scripts' digits too
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of integers"
        ) from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} holds a value below 1")
    return values


def _seed(text: str) -> int:
    """numpy's seeds: 0 to 2**64 - 1 (verify.SEED_MAX)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if not 0 <= value <= 2**64 - 1:
        raise argparse.ArgumentTypeError(f"{value} is not from 0 to {2**64 - 1}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is below 1")
    return value


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Any]:
    """A rich progress bar on stderr (nothing when stderr is no terminal, or with --json)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=console,
        transient=True,
        disable=not (enabled and console.is_terminal),
    ) as p:
        yield p


@contextlib.contextmanager
def _folder(keep: str | None) -> Iterator[str]:
    """Where candidates are built: `--keep DIR` (kept, and reused by a later run), else a
    temporary folder removed at the end."""
    if keep is None:
        with tempfile.TemporaryDirectory(prefix="fusec-tune-") as tmp:
            yield tmp
        return
    try:
        Path(keep).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _fail(f"cannot use --keep {keep}: {exc.strerror or exc}") from None
    yield keep


def _note(message: str) -> None:
    print(f"fusec: note: {message}", file=sys.stderr)


def _mode(args: argparse.Namespace) -> tuple[Any, Any, str | None]:
    """(device or None, the judging target or None, why it ranks instead of timing or None)."""
    from fusec.codegen.targets import TARGETS, target_for_device

    from .device import Device

    want = None
    if args.target is not None:
        if args.target not in TARGETS:
            raise _fail(f"unknown target '{args.target}'", "known targets: " + ", ".join(TARGETS))
        want = TARGETS[args.target]
    if want is not None and args.rank:
        return None, want, "--rank asked for a ranking"
    if args.time and want is None:
        raise _fail("--time needs --target T: the target the timed schedule is written for")
    try:
        dev = Device(args.device)
    except DiagnosticError as exc:
        if want is None:
            raise
        return None, want, f"no Vulkan device ({exc.diagnostics[0].message})"
    own = target_for_device(dev.info.name)
    if want is None:
        if own is None:
            name = dev.info.name
            dev.close()
            raise _fail(
                f"the device present ({name}) is no known target; schedule lines name one",
                "add --target T --time to time here and write the lines for T, or --target T "
                "to rank for T",
            )
        return dev, own, None
    if args.time:
        return dev, want, None
    if own is None or own.name != want.name:
        name = dev.info.name
        dev.close()
        return None, want, f"the device present ({name}) is not {want.name}"
    return dev, want, None


def cmd_tune(args: argparse.Namespace) -> int:
    from fusec.codegen.build import check_source

    from .cli import _consts
    from .tune import Filters, enumerate_schedules, instance_region, resolve
    from .tune_build import budget_rules, build_candidates

    # LF text without a byte order mark; `--write` stores the result as the file was
    text, stored = Stored.of(_read(args.file))
    path = args.file
    if args.from_json is not None:
        return _from_json(args, text, stored)
    if args.region is None:
        raise _fail("fusec tune needs --region R (or --from-json FILE with --write)")
    program = check_source(text, path)  # the file as it stands must check
    subject = resolve(text, path, args.region)
    consts = _consts(args.const)
    extra = budget_rules(args.budget, args.target)
    dev, target, why_ranked = _mode(args)
    try:
        region = instance_region(text, path, subject, target.name)
        region_ir = next(r for r in program.regions if r.name == region.name)
        names = [c.name for c in region_ir.consts]
        unknown = [n for n in consts if n not in names]
        if unknown:
            # refused in every mode, as check refuses it (a ranking does not use the values)
            raise _fail(
                f"--const {unknown[0]}: {subject.display} has no constant '{unknown[0]}'",
                "its constants: " + (", ".join(names) or "none"),
            )
        limits = [1024, target.max_workgroup_size]
        if dev is not None:
            limits.append(dev.info.max_workgroup_size)
        bad = [w for w in args.workgroups if w & (w - 1) or w > min(limits)]
        if bad:
            # the language takes powers of two up to the device's limit: say so, not "nothing
            # else was enumerated" after the run
            raise _fail(
                f"--workgroups {bad[0]} is not a workgroup size here",
                f"use powers of two from 1 to {min(limits)}, e.g. 64,256",
            )
        filters = Filters(tuple(args.workgroups), tuple(args.rows), args.max_candidates)
        schedules = enumerate_schedules(region, min(limits), filters)

        def device_wave(k: Any) -> int:
            """The subgroup size the device gives the kernel: the budget's wave there."""
            return int(dev.subgroup_size_for(k.subgroup.kind, k.subgroup.sizes) or 0)

        with (
            _folder(args.keep) as tmp,
            _progress(not args.json) as bar,
        ):
            task = bar.add_task("building", total=len(schedules))
            candidates, dropped = build_candidates(
                text,
                path,
                subject,
                schedules,
                Path(tmp),
                target.name,
                target,
                device_wave if dev is not None else None,
                extra,
                args.min_waves,
                advance=lambda: bar.advance(task),
            )
            result = _run(
                args,
                text,
                dev,
                target,
                why_ranked,
                subject,
                region,
                region_ir,
                candidates,
                dropped,
                consts,
                bar,
            )
    finally:
        if dev is not None:
            dev.close()
    result.update(
        {
            "region": subject.display,
            "instance": subject.name,
            "lines_for": target.name,
            "file": path,
            "enumerated": len(schedules),
            "dropped": dropped.to_json(),
        }
    )
    winner = result.pop("_winner")
    result["comment"] = _comment_of(result)
    result["written"] = (
        _write(path, text, stored, subject, winner, target.name, result["comment"])
        if args.write
        else False
    )
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        from .tune_print import print_result

        print_result(result)
    return 0


def _run(
    args: argparse.Namespace,
    text: str,
    dev: Any,
    target: Any,
    why_ranked: str | None,
    subject: Subject,
    region: Any,
    region_ir: Any,
    candidates: list[Any],
    dropped: Any,
    consts: dict[str, int | float],
    bar: Any,
) -> dict[str, Any]:
    """Time or rank the candidates; the result's JSON fields, best candidate first."""
    from .tune import contractions

    name = subject.display
    others = [c for c in candidates if not c.baseline]
    if not others:
        raise _fail(
            f"no schedule of region '{name}' is left besides its own: "
            + _dropped_sentence(dropped),
            "widen --workgroups/--rows/--max-candidates, or relax --budget",
        )
    rows: list[dict[str, Any]] = []
    if why_ranked is None:
        from .tune_time import draw, time_candidates
        from .verify import select_consts

        mine = select_consts(candidates[0].build, [region_ir], consts, dev)[region_ir.name]
        # batches of `--batch` candidates, each with the baseline: the device holds one batch's
        # weight copies at a time, and each ratio is to the baseline timed beside it
        base_c = candidates[0]
        rest = candidates[1:]
        size = max(1, args.batch - 1)
        batches = [rest[i : i + size] for i in range(0, len(rest), size)]
        drawn = draw(region_ir, base_c, mine, args.seed)
        task = bar.add_task("timing", total=args.submissions * len(batches))
        timed: list[tuple[Any, float, int]] = []  # (Timed, ratio, batch)
        base_us = []
        for n, batch in enumerate(batches):
            got = time_candidates(
                dev,
                region_ir,
                [base_c, *batch],
                drawn,
                dropped,
                lambda m: print(f"fusec: warning: {m}", file=sys.stderr),
                args.reps,
                args.submissions,
                args.copies,
                args.min_waves,
                advance=lambda: bar.advance(task),
            )
            base = got[0]
            assert base.candidate.baseline
            base_us.append(base.median_us)
            if n == 0:
                timed.append((base, 1.0, 0))
            timed += [(t, t.median_us / base.median_us, n) for t in got[1:]]
        timed.sort(key=lambda x: (x[1], not x[0].candidate.baseline))
        for t, ratio, n in timed:
            median = statistics.median(base_us) if t.candidate.baseline else t.median_us
            rows.append(
                _row(args, text, subject, target.name, t.candidate)
                | {
                    "path": t.path,
                    "median_us": round(median, 3),
                    "ratio": round(ratio, 4),
                    "batch": n,
                    "error_of_tolerance": round(t.error, 4),
                    "samples": t.samples,
                }
            )
        timed_only = [t for t, _, _ in timed]
        order = [t.candidate for t in timed_only]
        mode = {
            "mode": "timed",
            "device": dev.info.name,
            "consts": mine,
            "batches": len(batches),
            "baseline_us_per_batch": [round(u, 3) for u in base_us],
        }
    else:
        from .tune_rank import rank_candidates

        _note(f"ranked by the estimator without timing: {why_ranked}")
        if consts:
            _note("--const sets the constants of a timed run; the ranking uses the file's")
        weight_dtypes = {c.stage.name: c.weight_dtype for c in contractions(region)}
        task = bar.add_task("ranking", total=len(candidates))
        ranked = rank_candidates(
            target, candidates, weight_dtypes, not args.no_actual, _note, lambda: bar.advance(task)
        )
        for i, r in enumerate(ranked):
            rows.append(
                _row(args, text, subject, target.name, r.candidate)
                | {
                    "rank": i + 1,
                    "waves_per_simd": r.waves,
                    "vgprs": r.vgprs,
                    "in_flight_bytes": round(r.in_flight),
                    "aco": None
                    if r.actual is None
                    else {"waves_per_simd": r.actual[0], "vgprs": r.actual[1]},
                    "reasoning": r.reasoning,
                }
            )
        order = [r.candidate for r in ranked]
        mode = {"mode": "ranked", "why_ranked": why_ranked, "device": None, "consts": {}}
    return {
        **mode,
        "target": None if target is None else target.name,
        "baseline": next(r["label"] for r in rows if r["baseline"]),
        "winner": rows[0]["label"],
        "candidates": rows,
        "_winner": order[0].schedule,
    }


def _row(
    args: argparse.Namespace, text: str, subject: Subject, target: str, c: Any
) -> dict[str, Any]:
    from .tune import render_schedule

    return {
        "label": c.schedule.label(),
        "baseline": c.baseline,
        "schedule": c.schedule.to_json(),
        "source": render_schedule(text, args.file, subject, c.schedule, target),
        "verdict": c.verdict,
    }


def _dropped_sentence(dropped: Any) -> str:
    parts = [
        f"{n} by the {s}"
        for s, n in (
            (s, dropped.count(s)) for s in ("checker", "budget", "duplicate", "mismatch", "device")
        )
        if n
    ]
    return ("dropped " + ", ".join(parts)) if parts else "nothing else was enumerated"


def _comment_of(result: dict[str, Any]) -> str:
    """What the `# tuned` comment above written lines says: the measured figures, or the
    ranking's reasoning."""
    import datetime

    day = datetime.datetime.now(datetime.UTC).date().isoformat()
    rows = result["candidates"]
    win, base = rows[0], next(r for r in rows if r["baseline"])
    if result["mode"] == "timed":
        return (
            f"on {result['device']} {day}: {win['median_us']:.1f} us against "
            f"{base['median_us']:.1f} (baseline)"
        )
    return (
        f"for {result['target']} {day}, ranked by the estimator"
        f"{' and ACO' if win['aco'] is not None else ''} (not timed): {win['reasoning']}; "
        f"the baseline: waves {base['waves_per_simd']} at {base['vgprs']} VGPRs, "
        f"{base['in_flight_bytes']:,} B in flight"
    )


def _write(
    file: str,
    text: str,
    stored: Stored,
    subject: Subject,
    schedule: Schedule,
    target: str,
    comment: str,
) -> bool:
    """Write the winner's schedule lines into FILE (True) unless the instance already has that
    schedule on `target` (False); refused when FILE changed since it was read."""
    from fusec.codegen.build import check_source

    from .tune import apply_schedule, changed_lines, instance_region, schedule_of

    r = instance_region(text, file, subject, target)
    if schedule_of(r) == schedule:
        _note(f"{file} already holds the winning schedule of {subject.display}; not written")
        return False
    new = apply_schedule(text, file, subject, schedule, target, comment)
    try:  # what is written must still build: FILE is never left broken
        check_source(new, file)
    except DiagnosticError as exc:
        first = exc.diagnostics[0].message if exc.diagnostics else "it does not check"
        raise _fail(
            f"the schedule for {subject.display} on {target} would leave {file} broken "
            f"({first}); not written",
            "tune it again with this fusec, or check the --json result",
        ) from None
    if Stored.of(_read(file)) != (text, stored):
        raise _fail(f"{file} changed while tuning; not written", "run fusec tune again")
    _write_atomically(file, stored.restore(new))
    lines = ", ".join(map(str, changed_lines(text, new))) or "none: lines removed"
    _note(
        f"wrote the winning schedule of {subject.display} on {target} into {file} (line(s) {lines})"
    )
    return True


def _from_json(args: argparse.Namespace, text: str, stored: Stored) -> int:
    """`--from-json FILE --write`: write the winner a `--json` run recorded (maybe on another
    machine), after checking that the instance's schedule in FILE is still the run's
    baseline."""
    from fusec.codegen.build import check_source

    from .tune import Schedule, instance_region, resolve, schedule_of

    if not args.write:
        raise _fail("--from-json only writes; add --write")
    import jsonschema

    from .tune_record import RESULT_SCHEMA

    try:
        with open(args.from_json, encoding="utf-8") as f:
            result = json.load(f)
        jsonschema.validate(result, RESULT_SCHEMA)
        spec, target = result["region"], result["lines_for"]
        rows = result["candidates"]
        win = Schedule.from_json(rows[0]["schedule"])
        base = Schedule.from_json(next(r for r in rows if r["baseline"])["schedule"])
        comment = result.get("comment") or _comment_of(result)
    except OSError as exc:
        raise _fail(f"cannot read {args.from_json}: {exc.strerror or exc}") from None
    except (ValueError, KeyError, TypeError, StopIteration, jsonschema.ValidationError):
        raise _fail(f"{args.from_json} is no `fusec tune --json` result") from None
    if args.region is not None and args.region not in (spec, result.get("instance")):
        raise _fail(f"{args.from_json} tuned {spec}, not {args.region}")
    check_source(text, args.file)
    subject = resolve(text, args.file, spec)
    now = schedule_of(instance_region(text, args.file, subject, target))
    if now != base and now != win:
        raise _fail(
            f"{subject.display} on {target} in {args.file} is {now.label()}, not the tuned "
            f"run's baseline {base.label()}",
            "tune it again against the file as it is",
        )
    written = _write(args.file, text, stored, subject, win, target, comment)
    print(json.dumps({"region": subject.display, "lines_for": target, "written": written}))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of `fusec tune`."""
    p.add_argument("file", help="a .fuse file")
    p.add_argument(
        "--region",
        default=None,
        help="the instance to tune: gated_ffn<q4_0>, gated_ffn_q4_0, or a plain region",
    )
    p.add_argument(
        "--target",
        default=None,
        help="judge the budget on this target; without its hardware, rank by the estimator "
        "(default: the device's own target, timed)",
    )
    p.add_argument("--device", default=None, help="device name substring or index")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("--write", action="store_true", help="write the winner into FILE")
    p.add_argument(
        "--budget",
        action="append",
        default=[],
        metavar="RULE",
        help="waves>=N, vgprs<=N or spills<=N on the target, over the region's own (repeatable)",
    )
    p.add_argument(
        "--min-waves", type=_positive, default=None, help="override the budget's minimum"
    )
    p.add_argument("--const", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--workgroups", type=_ints, default=(), help="only these sizes, e.g. 64,256")
    p.add_argument("--rows", type=_ints, default=(), help="only these rows per subgroup, e.g. 1,2")
    p.add_argument(
        "--max-candidates", type=_positive, default=None, help="the baseline and its N-1 nearest"
    )
    p.add_argument("--reps", type=_positive, default=20, help="steps per submission (default 20)")
    p.add_argument(
        "--submissions", type=_positive, default=5, help="interleaved rounds (default 5)"
    )
    p.add_argument(
        "--batch",
        type=_positive,
        default=16,
        help="candidates timed side by side at once, the baseline among them (default 16)",
    )
    p.add_argument("--copies", type=_positive, default=None, help="weight copies to rotate")
    p.add_argument(
        "--seed", type=_seed, default=None, help="random seed of the inputs (default: fresh)"
    )
    p.add_argument(
        "--keep",
        metavar="DIR",
        default=None,
        help="keep the candidates' builds in DIR; a later run (on a machine without a "
        "compiler too) loads those already there instead of compiling them",
    )
    p.add_argument("--rank", action="store_true", help="with --target: rank even on its hardware")
    p.add_argument(
        "--time",
        action="store_true",
        help="with --target T: time on the present device though it is not T (lines for T)",
    )
    p.add_argument(
        "--from-json",
        metavar="JSON",
        default=None,
        help="with --write: write the winner a --json run recorded (checked against FILE)",
    )
    p.add_argument("--no-actual", action="store_true", help="rank without ACO's statistics")
