"""The `fusec` command: build, check, demo.

Diagnostics go to stderr as `FILE:LINE:COL: error: ...` (or `fusec: error: ...`), exit 1.
`build` imports the compiler only when called, so `check DIR` runs on a machine without shaderc.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsl.check import check as check_module
from dsl.diagnostics import Diagnostic, DiagnosticError
from dsl.parse import parse

from .device import Device


def _fail(message: str, hint: str | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(None, message, hint)])


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise _fail(f"cannot read {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"cannot read {path}: {exc}") from None


def _shared_limit(targets: Sequence[str]) -> int | None:
    from codegen.targets import TARGETS

    for t in targets:
        if t not in TARGETS:
            raise _fail(f"unknown target '{t}'", "known targets: " + ", ".join(TARGETS))
    return min(TARGETS[t].max_shared_bytes for t in targets) if targets else None


def _consts(items: Sequence[str]) -> dict[str, int | float]:
    out: dict[str, int | float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError
            out[name.strip()] = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            raise _fail(f"--const takes NAME=VALUE, not '{item}'", "e.g. --const K=1000") from None
    return out


def cmd_build(args: argparse.Namespace) -> int:
    from codegen.build import build_source, write_build

    text = _read(args.file)
    result = build_source(text, args.file, _shared_limit(args.target))
    out = write_build(result, args.output)
    n = len(result.kernels)
    print(
        f"fusec: built {len(result.program.regions)} region(s), {n} kernel(s) in "
        f"{result.seconds:.2f} s -> {out}/ (compiler: {result.manifest['compiler']})"
    )
    return 0


def _load_for_check(path: str, tmp: str) -> tuple[Any, Any]:
    """(Build, ir.Program) from a .fuse file (compiled now) or a build folder."""
    from .dispatch import Build

    p = Path(path)
    if p.is_dir() or p.name == "manifest.json":
        build = Build.load(p)
        copy = build.path / build.manifest.get("source_copy", "source.fuse")
        program = check_module(parse(_read(str(copy)), build.manifest["source"]))
        return build, program
    from codegen.build import build_source, write_build

    result = build_source(_read(path), path)
    write_build(result, Path(tmp) / "build")
    return Build.load(Path(tmp) / "build"), result.program


def _selected(program: Any, names: Sequence[str]) -> list[Any]:
    known = {r.name: r for r in program.regions}
    for n in names:
        if n not in known:
            raise _fail(f"no region '{n}' in {program.path}", "regions: " + ", ".join(known))
    return [known[n] for n in names] if names else list(program.regions)


def _fmt_err(e: float) -> str:
    return "inf" if e == float("inf") else f"{e:.2e}"


def cmd_check(args: argparse.Namespace) -> int:
    from .verify import check_region

    consts = _consts(args.const)
    with tempfile.TemporaryDirectory() as tmp:
        build, program = _load_for_check(args.file, tmp)
        regions = _selected(program, args.region)
        failed = 0
        with Device(args.device) as dev:
            print(f"device: {dev.info.name} ({dev.info.kind}, subgroup {dev.info.subgroup_size})")
            for r in regions:
                rc = {k: v for k, v in consts.items() if any(c.name == k for c in r.consts)}
                rep = check_region(dev, build, r, rc, args.seed)
                shown = ", ".join(f"{k}={v}" for k, v in rep.consts.items())
                print(
                    f"{rep.region} [{shown}]: {rep.path}; fused {rep.fused_dispatches} "
                    f"dispatch(es), {rep.fused_barriers} barrier(s); unfused "
                    f"{rep.unfused_dispatches} dispatch(es), {rep.unfused_barriers} barrier(s); "
                    f"subgroup {'/'.join(map(str, rep.subgroup_sizes))}"
                )
                for o in rep.outputs:
                    verdict = "ok" if o.ok else "MISMATCH"
                    print(
                        f"  {o.name}: max rel err fused {_fmt_err(o.fused_error)}, unfused "
                        f"{_fmt_err(o.unfused_error)} (tol {o.tolerance:g}, {rep.precision}) "
                        f"{verdict}"
                    )
                    if not o.ok:
                        failed += 1
                        worst = max(o.fused_error, o.unfused_error)
                        which = "fused" if o.fused_error > o.tolerance else "unfused"
                        print(
                            f"fusec: error: output '{o.name}' of region '{rep.region}' "
                            f"({which}) differs from the reference by {_fmt_err(worst)}, "
                            f"tolerance {o.tolerance:g}",
                            file=sys.stderr,
                        )
    return 1 if failed else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from codegen.build import build_source, write_build

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
        f"(compiler: {result.manifest['compiler']}) -> {args.output}/"
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
    ):
        table.add_column(col)
    failed = 0
    with Device(args.device) as dev:
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
                )
    console.print(table)
    console.print(
        f"build time: {build_s:.2f} s; "
        + ("every region verified" if not failed else f"{failed} output(s) mismatched")
    )
    return 1 if failed else 0


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
        help="override a constant, e.g. --const K=1000 (repeatable)",
    )
    c.add_argument("--seed", type=int, default=None, help="random seed (default: fresh)")
    c.set_defaults(fn=cmd_check)
    d = sub.add_parser("demo", help="build a file, verify every region, print a table")
    d.add_argument("file", nargs="?", default="kernels.fuse")
    d.add_argument("-o", "--output", default="build")
    d.add_argument("--device", default=None)
    d.add_argument("--seed", type=int, default=None)
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
    except Exception:  # our bug: say so in one line, keep the details in a file
        log = Path(tempfile.gettempdir()) / f"fusec-crash-{os.getpid()}.txt"
        log.write_text(traceback.format_exc())
        print(f"fusec: internal error (a bug in fusec); details in {log}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
