"""Decode a few tokens with the layer on a Vulkan device and check each against numpy.

    python examples/decode_layer/run.py BUILD_DIR [--preset tiny] [--weights f16|q8_0|q4_0]
        [--tokens 4] [--start POS] [--unfused]

The command buffer is recorded once and replayed for every token; only `pos` and the token's
input x are rewritten between submissions.  Each token's output and the caches' new rows are
compared with the numpy layer (runtime/decode_layer.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import attrs
import numpy as np

from fusec.codegen.targets import target_for_device
from fusec.runtime import decode_layer as layer
from fusec.runtime.device import Device, RuntimeFailure
from fusec.runtime.dispatch import Build
from fusec.runtime.persistent import (
    PersistentStep,
    persistent_or_chain,
    persistent_product,
    source_program,
)
from fusec.runtime.step import Step, StepBuffers, StepReport, decode_tokens, step_buffers

TOLERANCE = layer.TOLERANCE


@attrs.frozen
class Token:
    pos: int
    # out, kc, vt: relative error against numpy's layer, or against the right answer that
    # rounds `flipped` q8_0 values near a tie the other way, where that one is nearer
    errors: dict[str, float]
    flipped: int = 0


@attrs.frozen
class Decoded:
    report: StepReport
    tokens: tuple[Token, ...]
    outputs: tuple[dict[str, np.ndarray], ...]  # per token: out, kc, vt as the device left them


def decode(
    dev: Device,
    build: Build,
    preset: layer.Preset,
    wdtype: str,
    positions: Sequence[int],
    fused: bool = True,
    replay: bool = True,
    seed: int | None = None,
    attention: str | None = None,
    persistent: bool | None = None,
) -> Decoded:
    """Run the layer for the tokens at `positions` (in order), each with a fresh random x;
    `attention` picks attention's product (layer.ATTENTION; default FUSEC_ATTENTION);
    `persistent`: True, the whole layer as one dispatch (runtime/persistent.py; `fused`
    ignored); None, so with `fused` where FUSEC_PERSISTENT=on asks for it (the multi-dispatch
    chain when the product is refused); False, never."""
    rng = np.random.default_rng(seed)
    target = target_for_device(dev.info.name)
    calls = layer.calls(
        preset,
        wdtype,
        attention,
        regions=build.manifest,  # each projection's instance, for the weights' dtypes
        target=target.name if target is not None else None,
    )
    arrays = layer.random_state(preset, wdtype, rng)
    weights = layer.weight_values(arrays, preset, wdtype)
    # each token's input; its reference is made after the run, from the caches of the right
    # answer the previous token matched (layer.Answers: q8_0 rounding ties)
    xs = {pos: rng.standard_normal(preset.hidden).astype(np.float32) for pos in positions}
    state = dict(arrays)
    decls = step_buffers(build, calls)
    bufs = StepBuffers(dev, decls)
    step: Step | PersistentStep | None = None
    tokens, outputs = [], []
    try:
        bufs.upload(arrays)
        if persistent:
            step = PersistentStep(dev, build, calls, bufs, source_program())
        elif persistent is None and fused and persistent_product() == "on":
            step, why = persistent_or_chain(dev, build, calls, bufs, source_program())
            print(f"layer: {why.product} ({why.why})", file=sys.stderr)
        else:
            step = Step(dev, build, calls, bufs, fused)
        step.poison(keep=arrays)

        def before(pos: int) -> None:
            bufs.upload({"x": xs[pos]})

        def after(pos: int) -> None:
            got = {n: bufs.download(n) for n in ("out", "kc", "vt")}
            outputs.append(got)
            state["x"] = xs[pos]
            answers = layer.Answers(preset, state, weights, pos, wdtype)
            answer = answers.nearest(got, layer.AGREE[wdtype])
            tokens.append(Token(pos, answer.errors, answer.flipped))
            state["kc"], state["vt"] = answer.ref["kc"], answer.ref["vt"]

        report = decode_tokens(step, positions, before, after, replay)
    finally:
        if step is not None:
            step.close()
        bufs.destroy()
    return Decoded(report, tuple(tokens), tuple(outputs))


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python examples/decode_layer/run.py", description=__doc__)
    ap.add_argument("build", help="build folder of kernels.fuse (fusec build kernels.fuse -o DIR)")
    ap.add_argument("--preset", choices=sorted(layer.PRESETS), default="tiny")
    ap.add_argument("--weights", choices=layer.WEIGHT_DTYPES, default="f16")
    ap.add_argument("--tokens", type=int, default=4, choices=range(1, 65), metavar="1..64")
    ap.add_argument("--start", type=int, default=None, help="first position (default: C - tokens)")
    ap.add_argument("--unfused", action="store_true", help="every region as its unfused chain")
    args = ap.parse_args(argv)
    preset = layer.PRESETS[args.preset]
    start = preset.context - args.tokens if args.start is None else args.start
    if not 0 <= start <= preset.context - args.tokens:
        print(f"error: --start must be in 0 .. {preset.context - args.tokens}", file=sys.stderr)
        return 2
    positions = list(range(start, start + args.tokens))
    try:
        build = Build.load(args.build)
        with Device() as dev:
            res = decode(dev, build, preset, args.weights, positions, fused=not args.unfused)
            name = dev.info.name
    except RuntimeFailure as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    tol = TOLERANCE[args.weights]
    print(f"device: {name}; preset {preset.name}, {args.weights} weights")
    for region, path in res.report.paths:
        print(f"  {region}: {path}")
    print(f"per token: {res.report.dispatches} dispatches, {res.report.barriers} barriers")
    ok = True
    for t in res.tokens:
        good = all(e <= tol for e in t.errors.values())
        ok &= good
        errs = ", ".join(f"{n} {e:.2e}" for n, e in t.errors.items())
        ties = f"; {t.flipped} value(s) near a q8_0 tie rounded the other way" if t.flipped else ""
        print(f"  pos {t.pos}: {errs} (tol {tol:g}{ties}) {'ok' if good else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
