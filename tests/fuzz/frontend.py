"""Front-end fuzzing (issue 13, part 5): generated and mutated `.fuse` sources, and what fusec
makes of them.

- `fuse_sources()`: a hypothesis strategy of sources derived from dsl/fuse.lark itself
  (frontend_grammar.py reads the grammar with Lark's loader; frontend_bias.py steers the
  derivation so that names resolve and shapes agree often enough to reach the checker and
  codegen).
- `mutated_sources()`: a hypothesis strategy of mutations of kernels.fuse and the `.fuse` files
  under examples/ and tests/ (frontend_mutate.py).
- `generated_case(seed, i)` / `mutated_case(seed, i)`: the same two, driven by a seeded
  `random.Random` instead of hypothesis (the bench: fast, each case reproducible from its seed).
- `outcome(text) -> (kind, detail)`: parse, check and `build_source`; kind is "ok",
  "diagnostic" (every diagnostic rendered `FILE:LINE:COL: error: ...` or `fusec: error: ...`,
  inside the source) or "internal" (anything else, with the traceback's last lines).
  `classify()` says more (how far the text got, a signature to group internal errors by).
- `Pool`: worker processes that run `classify` with a timeout, so that a hang, a RecursionError
  that takes the interpreter down, or a segfault in one case costs that case only ("hang",
  "crash"), and that check nothing is written outside the case's output folder.
- `check_build()`: what `fusec check DIR --seed S` makes of a build (a job with `check_seed`):
  "verified", "refused" (in one sentence, `fusec: error: ...`), "skipped" (buffers past
  MAX_CHECK_BYTES, to keep a case fast), "nonfinite" or "ill-conditioned" (a miss that no
  correct kernel avoids: `explain_mismatch`), or a failure: "mismatch", or an internal error.

Compiling GLSL is most of a build's time; `classify(compile=False)` lowers and emits GLSL for
every kernel, estimates and writes the manifest, but hands shaderc's place to a stub.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import faulthandler
import json
import os
import random
import re
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from .frontend_bias import FuseBias
from .frontend_grammar import (
    Chooser,
    Deriver,
    DrawChooser,
    Layout,
    RandomChooser,
    chance,
    load_grammar,
    pick_weighted,
    render,
)
from .frontend_mutate import mutate

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tuple(str(ROOT / d) + os.sep for d in ("dsl", "codegen", "runtime"))
MAX_DEPTH = 34  # rule frames: about five levels of nested expressions
MAX_TOKENS = 450  # past this, every choice takes the shortest way out
KINDS = ("ok", "diagnostic", "internal", "mismatch", "hang", "crash")
# the furthest stage a text passed: "none" (no parse), "parse", "check", "build" (everything but
# shaderc), "compile" (shaderc too)
REACHED = ("none", "parse", "check", "build", "compile")
# what `fusec check` made of a checked build ("" for a case not checked)
CHECKS = ("verified", "refused", "skipped", "nonfinite", "ill-conditioned", "mismatch", "internal")
MAX_CHECK_BYTES = 64 << 20  # a fuzz check allocates at most this much: seconds on lavapipe


# --- sources ----------------------------------------------------------------------------------
def generate_source(ch: Chooser, loose: bool | None = None) -> str:
    """One source derived from the grammar.  Of the steered ones, 60% are meant to be valid
    and 40% carry deliberate mistakes; `loose` (default: 12% of sources) drops most of the
    steering."""
    grammar = load_grammar()
    if loose is None:
        loose = chance(ch, 0.12)
    heat = 1.0 if chance(ch, 0.4) else 0.0  # a zero draw (where shrinking goes) is clean
    bias = FuseBias(ch, grammar.keywords(), heat=heat, loose=loose)
    deriver = Deriver(grammar, ch, bias, MAX_DEPTH - (10 if loose else 0))
    deriver.max_tokens = MAX_TOKENS
    tokens = deriver.run()
    indent = pick_weighted(ch, (("    ", 0.92), ("  ", 0.03), ("\t", 0.03), ("        ", 0.02)))
    return render(tokens, ch, Layout(indent=indent, wrap=0.03, comment=0.02))


@st.composite
def fuse_sources(draw: st.DrawFn, loose: bool | None = None) -> str:
    """Sources derived from dsl/fuse.lark (most parse; a fair share check and build)."""
    return generate_source(DrawChooser(draw), loose)


@st.composite
def mutated_sources(draw: st.DrawFn, family: str | None = None) -> str:
    """kernels.fuse and the test sources, mutated (`family`: one of frontend_mutate.FAMILIES)."""
    return mutate(DrawChooser(draw), family)[1]


def _rng(seed: int, index: int, salt: str) -> RandomChooser:
    return RandomChooser(random.Random(f"{salt}:{seed}:{index}"))


def generated_case(seed: int, index: int) -> tuple[str, str]:
    """(description, text) of generated case `index` of run `seed`."""
    ch = _rng(seed, index, "gen")
    return f"generated {seed}:{index}", generate_source(ch)


def mutated_case(seed: int, index: int) -> tuple[str, str]:
    ch = _rng(seed, index, "mut")
    what, text = mutate(ch)
    return f"mutated {seed}:{index} ({what})", text


# --- classification ---------------------------------------------------------------------------
@dataclass
class Outcome:
    kind: str  # one of KINDS
    detail: str  # first line of the diagnostic, or the exception and traceback's last lines
    reached: str = "none"  # one of REACHED
    seconds: float = 0.0
    signature: str = ""  # internal errors: "ExcType at file:line (function)", to group by
    notes: list[str] = field(default_factory=list)  # diagnostics that look wrong, not failing
    check: str = ""  # one of CHECKS, for a checked build


# a SPIR-V 1.5 header and no instructions: what the estimator reads of the stub's output
_FAKE_SPIRV = bytes.fromhex("03022307") + (0x00010500).to_bytes(4, "little") + bytes(4)
_FAKE_SPIRV += (1).to_bytes(4, "little") + bytes(4)


def _fake_compile(text: str, name: str, sources: Any = None) -> bytes:
    return _FAKE_SPIRV


@contextlib.contextmanager
def _shaderc(enabled: bool) -> Iterator[None]:
    """build_source as is, or with shaderc's place taken by a stub (everything else runs)."""
    if enabled:
        yield
        return
    import fusec.codegen.build as build

    saved = build.compile_glsl, build.OBJECT_CACHE
    build.compile_glsl = _fake_compile
    build.OBJECT_CACHE = False  # the stub's output must not reach the user's object cache
    try:
        yield
    finally:
        build.compile_glsl, build.OBJECT_CACHE = saved


_HEAD = re.compile(r"(?P<path>.*):(?P<line>\d+):(?P<col>\d+): error: ")


def _diagnostic_problems(exc: Any, text: str, path: str) -> tuple[list[str], list[str]]:
    """(problems, notes): a rendering that is not `FILE:LINE:COL: error:` / `fusec: error:`,
    or a position outside the source, is a problem; a quoted line that is not that line of the
    file, or an indentation error at 1:1, is a note."""
    problems: list[str] = []
    notes: list[str] = []
    if not exc.diagnostics:
        problems.append("DiagnosticError with no diagnostics")
    lines = (text if text.endswith("\n") else text + "\n").split("\n")
    for d in exc.diagnostics:
        shown = d.render()
        if shown.startswith("fusec: error: "):
            continue
        m = _HEAD.match(shown)
        if m is None or m["path"] != path:
            problems.append(f"malformed diagnostic: {shown.splitlines()[0][:200]!r}")
            continue
        line, col = int(m["line"]), int(m["col"])
        if not 1 <= line <= len(lines) or not 1 <= col <= len(lines[line - 1]) + 1:
            problems.append(f"diagnostic at {line}:{col}, outside the source: {shown[:200]!r}")
            continue
        quoted = shown.split("\n")[1][4:] if "\n" in shown else ""
        if quoted != lines[line - 1].rstrip("\r"):
            notes.append(f"quoted line is not the line named: {line}:{col} {d.message}")
        if (line, col) == (1, 1) and "indent" in d.message and len(lines) > 2:
            notes.append(f"indentation error at 1:1: {d.message}")
    return problems, notes


def _signature(exc: BaseException) -> tuple[str, str]:
    """(signature, detail): the exception type and the project frame it came from."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f.filename.startswith(PROJECT)]
    where: traceback.FrameSummary | None = None
    if isinstance(exc, RecursionError) and ours:
        place = collections.Counter((f.filename, f.name) for f in ours).most_common(1)[0][0]
        where = next(f for f in reversed(ours) if (f.filename, f.name) == place)
    elif ours or frames:
        where = (ours or frames)[-1]
    loc = "?"
    if where is not None:
        loc = f"{os.path.relpath(where.filename, ROOT)}:{where.lineno} ({where.name})"
    kind = type(exc).__name__
    tail = "".join(traceback.format_exception(exc)[-4:]).strip()
    message = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{kind} at {loc}", f"{kind}: {message}\n{tail[-1500:]}"


def classify(
    text: str,
    path: str = "fuzz.fuse",
    compile: bool = True,
    out_dir: Path | None = None,
    check_seed: int | None = None,
) -> Outcome:
    """Parse, check and build `text` in this process (no timeout: see `Pool`); with
    `check_seed`, also run what builds through `check_build` (shaderc included)."""
    from fusec.codegen.build import build_source, check_source, write_build
    from fusec.dsl.diagnostics import DiagnosticError
    from fusec.dsl.parse import parse

    t0 = time.perf_counter()
    reached = "none"
    try:
        parse(text, path)
        reached = "parse"
        check_source(text, path)
        reached = "check"
        with _shaderc(compile):
            result = build_source(text, path)
        reached = "compile" if compile else "build"
        if out_dir is not None:
            write_build(result, out_dir)
    except DiagnosticError as exc:
        seconds = time.perf_counter() - t0
        problems, notes = _diagnostic_problems(exc, text, path)
        if problems:
            return Outcome(
                "internal", "\n".join(problems), reached, seconds, "MalformedDiagnostic", notes
            )
        return Outcome("diagnostic", exc.render().split("\n")[0][:300], reached, seconds, "", notes)
    except Exception as exc:  # RecursionError and MemoryError included: our bugs all
        signature, detail = _signature(exc)
        return Outcome("internal", detail, reached, time.perf_counter() - t0, signature)
    kernels = len(result.kernels)
    if check_seed is None or not compile:
        return Outcome("ok", f"{kernels} kernel(s)", reached, time.perf_counter() - t0)
    if out_dir is None:
        out_dir = Path(tempfile.mkdtemp()) / "build"
        write_build(result, out_dir)
    check, detail, signature = check_build(result.program, out_dir, check_seed)
    kind = {"mismatch": "mismatch", "internal": "internal"}.get(check, "ok")
    if kind == "ok":
        detail = f"{kernels} kernel(s); {detail}"
    return Outcome(kind, detail, reached, time.perf_counter() - t0, signature, check=check)


# --- checking what builds ---------------------------------------------------------------------
_DEVICE: Any = None  # opened by the first check of a worker, kept for the next ones


def _device() -> Any:
    from fusec.runtime.device import Device

    global _DEVICE
    if _DEVICE is None or _DEVICE.closed:
        _DEVICE = Device(None, robust=True)  # as `fusec check` opens it
    return _DEVICE


def _one_sentence(exc: Any) -> bool:
    """A refusal as `fusec check` prints it: `fusec: error: ...` (and perhaps a hint)."""
    return bool(exc.diagnostics) and all(d.span is None for d in exc.diagnostics)


def explain_mismatch(
    region_ir: Any,
    inputs: dict[str, Any],
    consts: dict[str, int | float],
    name: str,
    tol: float,
    got: dict[str, Any],
) -> tuple[str, str]:
    """Why output `name` missed the tolerance, given the products' values (`got`: "fused" and
    "unfused" to their output arrays): ("nonfinite", ...) when the float64 reference is NaN or
    infinite somewhere (the root or log of a negative, 0 / 0: GLSL leaves those undefined) and
    both products agree with it within `tol` everywhere else; ("ill-conditioned", ...) when the
    reference computed in float32, each operation rounded once as a GPU kernel at best does,
    misses the float64 one by more than `tol` (cancellation in a sum, exp overflow, a division
    near 0: no correct f32 kernel meets the tolerance on these inputs); else ("mismatch", ...).
    An integer output is exact in any correct kernel: it is never ill-conditioned."""
    import numpy as np

    from fusec.dsl.reference import run_reference
    from fusec.runtime.verify import relative_error

    with np.errstate(all="ignore"):
        ref64 = run_reference(region_ir, inputs, consts)[name]
        ref32 = run_reference(region_ir, inputs, consts, real=np.float32)[name]
    defined = np.isfinite(ref64.astype(np.float64))
    errors = {
        k: relative_error(np.reshape(v, ref64.shape)[defined], ref64[defined])
        for k, v in got.items()
    }
    shown = ", ".join(f"{k} {e:.3g}" for k, e in errors.items())
    if not defined.all():
        where = f"the reference is not finite at {int((~defined).sum())} of {defined.size} places"
        if max(errors.values()) <= tol:
            return "nonfinite", f"{where}; elsewhere {shown}"
        shown = f"{shown} where it is ({where})"
    out = next(b for b in region_ir.outputs if b.name == name)
    f32 = relative_error(ref32[defined], ref64[defined])
    if not out.dtype.is_int and f32 > tol:
        return "ill-conditioned", f"{shown}; the float32 reference misses by {f32:.3g}"
    return "mismatch", f"{shown}; the float32 reference misses by {f32:.3g}"


def check_build(program: Any, out: Path, seed: int) -> tuple[str, str, str]:
    """(check, detail, signature) for the build folder `out` of `program`, run as
    `fusec check out --seed seed` runs it (runtime.cli.cmd_check: load and validate the folder,
    spirv-val, refuse constants and sizes, then fused, unfused and the numpy reference per
    region), on a device opened once per process.  check is one of CHECKS."""
    import numpy as np

    from fusec.dsl.diagnostics import DiagnosticError
    from fusec.runtime.dispatch import Build, RegionRunner, buffer_bytes, const_values
    from fusec.runtime.verify import check_region, random_inputs, select_consts

    notes: list[str] = []
    try:
        build = Build.load(out)
        build.check_program(program)
        build.verify()
        regions = list(program.regions)
        for r in regions:
            region = build.region(r.name)
            size = sum(buffer_bytes(region, const_values(region, {})).values())
            if size > MAX_CHECK_BYTES:
                return "skipped", f"region '{r.name}' needs {size} bytes of buffers", ""
        dev = _device()
        consts = select_consts(build, regions, {}, dev)
        verdict = "verified"
        for r in regions:
            rep = check_region(dev, build, r, consts[r.name], seed)
            bad = [o for o in rep.outputs if not o.ok]
            if not bad:
                continue
            # the same draw again, to see the values: check_region reports errors only
            region = build.region(r.name)
            values = const_values(region, consts[r.name])
            with np.errstate(all="ignore"):
                inputs = random_inputs(region, values, np.random.default_rng(seed))
            runner = RegionRunner(dev, build, r.name, values)
            try:
                got = {
                    k: runner.run(inputs, fused=k == "fused").outputs for k in ("fused", "unfused")
                }
            finally:
                runner.close()
            for o in bad:
                which = [
                    k
                    for k, e in (("fused", o.fused_error), ("unfused", o.unfused_error))
                    if e > o.tolerance
                ]
                kind, why = explain_mismatch(
                    r, inputs, values, o.name, o.tolerance, {k: v[o.name] for k, v in got.items()}
                )
                shown = (
                    f"output '{o.name}' of region '{r.name}': fused {o.fused_error:.3g}, "
                    f"unfused {o.unfused_error:.3g}, tolerance {o.tolerance:g}; {why}"
                )
                if kind == "mismatch":
                    return "mismatch", shown, f"mismatch ({', '.join(which)})"
                notes.append(shown)
                verdict = kind if verdict == "verified" else verdict
        return verdict, "; ".join(notes) or f"{len(regions)} region(s)", ""
    except DiagnosticError as exc:
        if _one_sentence(exc):
            return "refused", exc.render().split("\n")[0][:300], ""
        signature = "MalformedRefusal"
        return "internal", exc.render()[:500], signature
    except MemoryError:
        # the worker's address space (Pool's memory_mb) cannot hold the float64 reference, or
        # its float32 twin: dequantized q4_0 weights take 16 times their bytes
        return "skipped", "the numpy reference ran out of this worker's memory", ""
    except Exception as exc:
        signature, detail = _signature(exc)
        return "internal", detail, signature


def outcome(text: str, path: str = "fuzz.fuse", compile: bool = True) -> tuple[str, str]:
    """(kind, detail): "ok", "diagnostic" or "internal" (see `classify`)."""
    o = classify(text, path, compile)
    return o.kind, o.detail


# --- worker processes -------------------------------------------------------------------------
@dataclass
class Job:
    key: Any  # the caller's handle (a case index)
    text: str
    compile: bool = False
    write: bool = False  # also write the build folder (the CLI's `-o DIR`)
    check_seed: int | None = None  # run a build that compiles through `fusec check --seed`


def _clear(folder: Path, keep: tuple[str, ...] = ()) -> None:
    for p in folder.iterdir():
        if p.name in keep:
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink()


def run_in_scratch(job: Job, home: Path) -> Outcome:
    """One job in `home` (the worker's cwd; TMPDIR is home/tmp): the build folder, if asked for,
    goes to home/out, and nothing else may appear in `home`."""
    out = home / "out" if job.write else None
    result = classify(job.text, compile=job.compile, out_dir=out, check_seed=job.check_seed)
    if out is not None and result.kind == "ok" and not (out / "manifest.json").is_file():
        result = Outcome("internal", "built, but -o DIR holds no manifest.json", result.reached)
        result.signature = "MissingOutput"
    stray = sorted(p.name for p in home.iterdir() if p.name not in ("tmp", "out"))
    if stray:
        result = Outcome(
            "internal",
            f"files written outside the output folder: {stray} (the case was {result.kind}: "
            f"{result.detail[:200]})",
            result.reached,
            result.seconds,
            "StrayFile",
        )
    _clear(home, keep=("tmp",))
    _clear(home / "tmp")
    return result


def worker_main(scratch: str, memory_mb: int) -> None:
    """`python -m tests.fuzz.frontend --worker DIR`: a job per line of JSON on stdin, an outcome
    per line of JSON on stdout, until stdin closes."""
    faulthandler.enable()
    home = Path(scratch)
    os.chdir(home)
    (home / "tmp").mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(home / "tmp")
    tempfile.tempdir = str(home / "tmp")
    if memory_mb:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever fusec prints goes to stderr, never into the protocol
    import fusec.codegen.build  # noqa: F401  (loaded once, before the first timed case)

    for line in sys.stdin:
        job = Job(**json.loads(line))
        result = run_in_scratch(job, home)
        protocol.write(json.dumps(dataclasses.asdict(result)) + "\n")
        protocol.flush()


@dataclass
class _Slot:
    proc: subprocess.Popen[bytes]
    scratch: Path
    job: Job | None = None
    started: float = 0.0
    buffer: bytes = b""


class Pool:
    """Worker processes running `classify`, `timeout_s` per case: a longer one is a "hang", a
    worker that dies a "crash" (with the end of its stderr: faulthandler's traceback); either
    way the worker is replaced."""

    def __init__(self, workers: int = 2, timeout_s: float = 30.0, memory_mb: int = 3072) -> None:
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.root = Path(tempfile.mkdtemp(prefix="fusec-fuzz-"))
        self.slots = [self._spawn() for _ in range(workers)]

    def _spawn(self) -> _Slot:
        scratch = Path(tempfile.mkdtemp(dir=self.root))
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1")
        command = [sys.executable, "-m", "tests.fuzz.frontend", "--worker", str(scratch)]
        with (scratch.parent / f"{scratch.name}.stderr").open("wb") as stderr:
            proc = subprocess.Popen(
                [*command, "--memory-mb", str(self.memory_mb)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                cwd=scratch,
                env=env,
            )
        return _Slot(proc, scratch)

    def _stderr_tail(self, slot: _Slot) -> str:
        try:
            text = (slot.scratch.parent / f"{slot.scratch.name}.stderr").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-12:])

    def _replace(self, slot: _Slot) -> None:
        if slot.proc.poll() is None:
            slot.proc.kill()
        slot.proc.wait(10)
        for f in (slot.proc.stdin, slot.proc.stdout):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        shutil.rmtree(slot.scratch, ignore_errors=True)
        self.slots[self.slots.index(slot)] = self._spawn()

    def run(self, job: Job) -> Outcome:
        return next(self.map([job]))[1]

    def _send(self, slot: _Slot, job: Job) -> None:
        assert slot.proc.stdin is not None
        slot.job, slot.started, slot.buffer = job, time.monotonic(), b""
        try:
            slot.proc.stdin.write((json.dumps(dataclasses.asdict(job)) + "\n").encode())
            slot.proc.stdin.flush()
        except OSError:
            pass  # a dead worker: its stdout is at EOF, which map() reports as a crash

    def map(self, jobs: Iterable[Job]) -> Iterator[tuple[Job, Outcome]]:
        """Each job's outcome, in the order they finish."""
        todo = iter(jobs)
        exhausted = False
        while True:
            for slot in self.slots:
                if slot.job is None and not exhausted:
                    job = next(todo, None)
                    if job is None:
                        exhausted = True
                    else:
                        self._send(slot, job)
            busy = [s for s in self.slots if s.job is not None]
            if not busy:
                return
            deadline = min(s.started for s in busy) + self.timeout_s
            fds = {s.proc.stdout.fileno(): s for s in busy if s.proc.stdout is not None}
            ready, _, _ = select.select(list(fds), [], [], max(0.0, deadline - time.monotonic()))
            now = time.monotonic()
            for slot in busy:
                job = slot.job
                assert job is not None and slot.proc.stdout is not None
                elapsed = now - slot.started
                result: Outcome | None = None
                if slot.proc.stdout.fileno() in ready:
                    data = os.read(slot.proc.stdout.fileno(), 1 << 16)
                    if not data:
                        code = slot.proc.wait(10)
                        tail = self._stderr_tail(slot)
                        result = Outcome("crash", f"worker died (exit code {code})\n{tail}")
                        result.signature = f"crash (exit code {code})"
                        result.seconds = elapsed
                        slot.job = None
                        self._replace(slot)
                    else:
                        slot.buffer += data
                        if slot.buffer.endswith(b"\n"):
                            result = Outcome(**json.loads(slot.buffer))
                            slot.job = None
                elif elapsed >= self.timeout_s:
                    result = Outcome("hang", f"no answer after {elapsed:.0f} s", seconds=elapsed)
                    result.signature = "hang"
                    slot.job = None
                    self._replace(slot)
                if result is not None:
                    yield job, result

    def close(self) -> None:
        for slot in self.slots:
            with contextlib.suppress(OSError):
                if slot.proc.stdin is not None:
                    slot.proc.stdin.close()
        for slot in self.slots:
            try:
                slot.proc.wait(5)
            except subprocess.TimeoutExpired:
                slot.proc.kill()
                slot.proc.wait(5)
            if slot.proc.stdout is not None:
                slot.proc.stdout.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- shrinking --------------------------------------------------------------------------------
def shrink(text: str, still_fails: Any, budget: int = 400) -> str:
    """A smaller text for which `still_fails(text)` holds: drop chunks of lines, then chunks of
    tokens (each with the blanks after it), halving the chunk when nothing goes (greedy delta
    debugging).  `budget` bounds the calls."""
    calls = 0

    def attempt(candidate: str) -> bool:
        nonlocal calls
        if calls >= budget or candidate == text:
            return False
        calls += 1
        return bool(still_fails(candidate))

    for unit in ("line", "token"):
        if unit == "line":
            parts = text.split("\n")
            join = "\n"
        else:  # a token with the blanks after it
            parts = re.findall(r"[A-Za-z_]\w*[ \t]*|\d[\w.]*[ \t]*|\S[ \t]*|\s+", text)
            join = ""
        chunk = max(1, len(parts) // 2)
        while chunk >= 1 and calls < budget:
            i = 0
            progress = False
            while i < len(parts) and calls < budget:
                candidate_parts = parts[:i] + parts[i + chunk :]
                candidate = join.join(candidate_parts)
                if candidate_parts and attempt(candidate):
                    parts = candidate_parts
                    text = candidate
                    progress = True
                else:
                    i += chunk
            if not progress:
                chunk //= 2
    return text


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="a front-end fuzzing worker (see Pool)")
    ap.add_argument("--worker", required=True, metavar="DIR")
    ap.add_argument("--memory-mb", type=int, default=3072)
    args = ap.parse_args(argv)
    worker_main(args.worker, args.memory_mb)


if __name__ == "__main__":
    main()
