"""Estimator corpus (issue 14, part 2): random `.fuse` regions, and their kernels' estimates
held against ACO through RADV's null device.

- `region_source(chooser, name)`: one random region of a random kernel family (matvec with every
  layout, gate/up sharing an operand, RMSNorm preambles, lane rows, split-K and global splits,
  register tiles with slots and `repeat`, per-workgroup softmax and head projections).
  `regions()` is the hypothesis strategy, `case_source(seed, index)` the seeded twin: case i of
  seed s is the same text on every machine.
- `corpus(seed, n)`: the first n cases of a seed as `Case`s.
- `compare(cases, targets, waves)`: builds the cases in batches (one `.fuse` file and one build
  folder per batch), compiles every kernel (fused, the tile's shared-exchange variant, unfused)
  through ACO in a child process per (batch, target) and returns one row per kernel, target and
  wave.  A kernel the driver aborts on (navi21 has no float atomics: `Unsupported opcode:
  buffer_atomic_add_f32`) costs a restart of that child: the child announces every pipeline
  before it creates it, so the parent knows the culprit, records it as `aco_failed` and runs
  the rest.
- `summarize(rows)`, `acceptance_failures(rows)`, `worst(rows)`: the figures.

Run the worker by hand: `python -m tests.estimator.corpus worker BUILD_DIR WAVES SKIPFILE`.
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from hypothesis import strategies as st

if TYPE_CHECKING:
    from fusec.codegen import manifest_records as mr

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")

TARGETS_ALL = ("gfx1201", "gfx1151", "navi31", "navi21")
WAVES_ALL = (32, 64)
# CI: gfx1201 (gfx1151 and navi31 give the same figures on every run) and navi21 (RDNA2: its
# smaller register file and denser occupancy steps in wave64, its lack of float atomics), both
# wave sizes; navi21's wave64 pipelines add about 20 s on 2 cores (one driver start-up serves
# both wave sizes)
CI_PAIRS = (("gfx1201", 32), ("gfx1201", 64), ("navi21", 32), ("navi21", 64))
BATCH_REGIONS = 40  # regions per .fuse file and per build folder (one driver start-up each)


# --- choices -------------------------------------------------------------------------------------
class Chooser(Protocol):
    def choice(self, options: Sequence[T]) -> T: ...
    def integer(self, lo: int, hi: int) -> int: ...
    def chance(self, p: float) -> bool: ...


class RandomChooser:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def choice(self, options: Sequence[T]) -> T:
        return options[self.rng.randrange(len(options))]

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


class DrawChooser:
    def __init__(self, draw: Callable[[st.SearchStrategy[Any]], Any]) -> None:
        self.draw = draw

    def choice(self, options: Sequence[T]) -> T:
        return options[self.draw(st.integers(0, len(options) - 1))]  # type: ignore[no-any-return]

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))  # type: ignore[no-any-return]

    def chance(self, p: float) -> bool:
        return self.draw(st.integers(0, 999)) < int(p * 1000)  # type: ignore[no-any-return]


# --- the generator -------------------------------------------------------------------------------
WDTYPES = ("f32", "f16", "q8_0", "q4_0", "q4_K", "q6_K")
# GGUF weights that take integer dot products against q8_0 activations at 32 per lane
INT_DOT = ("q8_0", "q4_0", "q4_K", "q6_K")
VECTORS = (1, 2, 4, 8, 16)


def _weights(c: Chooser) -> str:
    return c.choice(WDTYPES)


def _vector(c: Chooser, dt: str) -> int:
    """A vector width; quantized weights take whole blocks sometimes (x 32)."""
    if dt in INT_DOT and c.chance(0.25):
        return 32
    return c.choice(VECTORS)


def _k(c: Chooser) -> int:
    # few sizes: the unfused chains of different regions then share kernels (compared once)
    return c.choice((512, 2048))


def _launch(
    c: Chooser,
    rows: int | None = None,
    wgs: Sequence[int] = (64, 128, 256, 512),
    unit: str = "subgroup",
) -> str:
    """`rows_per_subgroup` R (at most 4 when rows map to the workgroup)."""
    wg = c.choice(wgs)
    r = rows if rows is not None else c.choice((1, 1, 2, 2, 3, 4, 8, 16))
    if unit == "workgroup":
        r = min(r, 4)
    return f"launch workgroup {wg}, subgroup any, rows_per_subgroup {r}"


def _epilogue(c: Chooser, a: str, b: str | None, extra: str | None) -> str:
    """An elementwise combination of reduced values a (and b), maybe with an extra input."""
    if b is None:
        forms = ["{a}", "silu({a})", "{a} * {a}", "exp({a} * 0.01)", "tanh({a})"]
    else:
        forms = ["silu({a}) * {b}", "{a} * {b}", "{a} + {b}", "{a} * sigmoid({b})", "max({a}, {b})"]
    e = c.choice(forms).format(a=a, b=b)
    if extra is not None:
        e = c.choice(["{e} + {x}", "{e} * {x}", "{x} + {e}"]).format(e=e, x=extra)
    return e


def gen_matvec(c: Chooser, name: str) -> str:
    """y = W.x with any layout (rows -> subgroup / workgroup, k -> lane x V), maybe a residual
    or activation epilogue."""
    dt = _weights(c)
    v = _vector(c, dt)
    unit = c.choice(("subgroup", "subgroup", "workgroup"))
    k, n = _k(c), c.choice((256, 1024))
    resid = c.chance(0.25)
    act = c.chance(0.2)
    ins = f"x: f32[K], W: {dt}[N, K]" + (", r: f32[N]" if resid else "")
    lines = [
        f"region {name}({ins}) -> y: f32[N]",
        f"    const K = {k}, N = {n}",
        "    " + _launch(c, unit=unit),
    ]
    lay = (
        f"layout n -> {unit}, k -> lane x {v}" if v > 1 or c.chance(0.5) else f"layout n -> {unit}"
    )
    if resid or act:
        lines.append(f"    p[n] = sum(k: W[n, k] * x[k]) {lay}")
        e = _epilogue(c, "p[n]", None, "r[n]" if resid else None)
        lines.append(f"    y[n] = {e}")
    else:
        lines.append(f"    y[n] = sum(k: W[n, k] * x[k]) {lay}")
    return "\n".join(lines) + "\n"


def _preamble(c: Chooser, q8: bool) -> tuple[list[str], str]:
    """RMSNorm + weight: ss in shared, xn in shared (maybe as q8_0) or in registers."""
    place = "in shared as q8_0" if q8 else c.choice(("in shared", "in shared", "in register"))
    ss_place = c.choice(("in shared", "in shared", "in register"))
    return [
        f"    ss = sum(k: x[k] * x[k]) @ workgroup {ss_place}",
        f"    xn[k] = x[k] * rsqrt(ss / K + eps) * g[k] {place}",
    ], "xn"


def gen_gated(c: Chooser, name: str) -> str:
    """Several contractions sharing one operand (gate/up), an epilogue, maybe an RMSNorm preamble
    and an activation quantized to q8_0."""
    dt = _weights(c)
    v = _vector(c, dt)
    nred = c.choice((2, 2, 2, 3, 4))
    norm = c.chance(0.5)
    q8 = dt in INT_DOT and v == 32 and c.chance(0.6)
    k, f = _k(c), c.choice((256, 1024))
    ws = [f"W{i}" for i in range(nred)]
    ins = (
        "x: f32[K]"
        + (", g: f32[K]" if norm or q8 else "")
        + "".join(f", {w}: {dt}[F, K]" for w in ws)
    )
    resid = c.chance(0.3)
    if resid:
        ins += ", r: f32[F]"
    lines = [
        f"region {name}({ins}) -> h: f32[F]",
        f"    const K = {k}, F = {f}, eps = 1e-6",
        "    " + _launch(c, wgs=(128, 256, 512)),
    ]
    operand = "x"
    if norm or q8:
        pre, operand = _preamble(c, q8)
        lines += pre
    for i, w in enumerate(ws):
        lines.append(
            f"    a{i}[f] = sum(k: {w}[f, k] * {operand}[k]) layout f -> subgroup, k -> lane x {v}"
        )
    acc = _epilogue(c, "a0[f]", "a1[f]", "r[f]" if resid else None)
    for i in range(2, nred):
        acc = f"({acc}) {c.choice(('+', '*'))} a{i}[f]"
    lines.append(f"    h[f] = {acc}")
    return "\n".join(lines) + "\n"


def gen_norm_matvec(c: Chooser, name: str) -> str:
    """RMSNorm + mul + one projection (rms_norm_mul_matvec and its q8_0 activation form)."""
    dt = _weights(c)
    v = _vector(c, dt)
    q8 = dt in INT_DOT and v == 32 and c.chance(0.7)
    k, n = _k(c), c.choice((256, 1024))
    unit = c.choice(("subgroup", "subgroup", "workgroup"))
    lines = [
        f"region {name}(x: f32[K], g: f32[K], W: {dt}[N, K]) -> y: f32[N]",
        f"    const K = {k}, N = {n}, eps = 1e-6",
        "    " + _launch(c, unit=unit),
    ]
    pre, operand = _preamble(c, q8)
    lines += pre
    lines.append(
        f"    y[n] = sum(k: W[n, k] * {operand}[k]) @ subgroup layout n -> {unit}, k -> lane x {v}"
    )
    return "\n".join(lines) + "\n"


def gen_add_norm(c: Chooser, name: str) -> str:
    """Residual add + RMSNorm, elementwise, with two outputs (add_rms_norm)."""
    k = c.choice((1024, 4096, 16384))
    return (
        f"region {name}(a: f32[K], b: f32[K], g: f32[K]) -> (h: f32[K], out: f32[K])\n"
        f"    const K = {k}, eps = 1e-6\n"
        f"    launch workgroup {c.choice((64, 256, 1024))}, subgroup any\n"
        f"    hh[k] = a[k] + b[k]{c.choice(('', ' * 0.5', ' - 1.0'))}\n"
        "    ss = sum(k: hh[k] * hh[k]) @ workgroup in shared\n"
        "    h[k] = hh[k]\n"
        "    out[k] = hh[k] * rsqrt(ss / K + eps) * g[k]\n"
    )


def gen_lane_rows(c: Chooser, name: str) -> str:
    """Rows on lanes: `layout i -> lane`, or `@ lane` reductions (each lane loops over the whole
    reduced index), sometimes several and an epilogue."""
    kk, n = c.choice((4, 8, 32, 128)), c.choice((256, 1024))
    red = c.choice(("sum", "sum", "max"))
    form = c.choice(("layout", "at_lane", "two"))
    lines = [
        f"region {name}(x: f32[K, N], w: f32[K], z: f32[N]) -> y: f32[N]",
        f"    const N = {n}, K = {kk}",
        f"    launch workgroup {c.choice((64, 256, 1024))}",
    ]
    if form == "layout":
        v = c.choice(("", " x 1"))
        lines.append(f"    y[i] = {red}(k: x[k, i] * w[k]) * z[i] layout i -> lane{v}")
    elif form == "at_lane":
        lines.append(f"    y[i] = {red}(k: w[k] * x[k, i]) @ lane + z[i]")
    else:
        lines.append("    a[i] = sum(k: w[k] * x[k, i]) @ lane")
        lines.append(f"    b[i] = {red}(k: x[k, i] * x[k, i]) @ lane")
        lines.append(f"    y[i] = {_epilogue(c, 'a[i]', 'b[i]', 'z[i]')}")
    return "\n".join(lines) + "\n"


def gen_down(c: Chooser, name: str) -> str:
    """Gate/up/SwiGLU, then the down projection: split-K (`in slices`, float atomics) or two
    kernels (`in global`)."""
    dt = c.choice(("f32", "f16", "f16"))
    v, v2 = c.choice((1, 2, 4, 8)), c.choice((1, 2, 4, 8, 16))
    place = c.choice(("in slices", "in global"))
    h, f = c.choice((512, 2048)), c.choice((512, 2048))
    return (
        f"region {name}(x: f32[H], Wg: {dt}[F, H], Wu: {dt}[F, H], Wd: {dt}[H, F]) -> y: f32[H]\n"
        f"    const H = {h}, F = {f}\n"
        f"    {_launch(c, rows=c.choice((1, 2, 4)), wgs=(128, 256))}\n"
        f"    gate[f] = sum(k: Wg[f, k] * x[k]) layout f -> subgroup, k -> lane x {v}\n"
        f"    up[f] = sum(k: Wu[f, k] * x[k]) layout f -> subgroup, k -> lane x {v}\n"
        f"    hh[f] = {_epilogue(c, 'gate[f]', 'up[f]', None)} {place}\n"
        f"    y[n] = sum(f: Wd[n, f] * hh[f]) layout n -> subgroup, f -> lane x {v2}\n"
    )


def gen_tile(c: Chooser, name: str) -> str:
    """A register tile: lanes x slots per token, values kept live across slot reductions,
    lane reductions (shuffles), maybe a `repeat` loop (Sinkhorn-like)."""
    lanes = c.choice((2, 4, 8, 16, 32))
    on_slots = c.chance(0.8)
    live = c.choice((1, 1, 2, 2, 3, 4))  # values read across slot reductions
    loop = c.chance(0.6)
    if on_slots:
        max_slots = 256 // (live + loop)  # `c` too is read across slots in the loop
        slots = c.choice([s for s in (4, 8, 16, 32, 64, 128, 256) if s <= max_slots])
    else:
        slots = 1
    a_ext = slots if on_slots else c.choice((2, 4))
    if not on_slots:
        lanes = max(lanes, 2)
        while lanes * a_ext > 64:
            lanes //= 2
    width = a_ext * lanes
    tvals = 4
    sub = lanes if on_slots else lanes * a_ext
    exchange = " else shared" if sub > 4 and c.chance(0.5) else ""
    if on_slots:
        tile = f"tile (i: {a_ext}, j: {lanes}) lane j, slot i, per t"
    else:
        tile = f"tile (i: {a_ext}, j: {lanes}) lane j + {lanes} * i, per t"
    lines = [
        f"region {name}(m: f32[T, {width}], s: f32[3]) -> C: f32[T, {a_ext}, {lanes}]",
        f"    const T = {tvals}, iters = {c.choice((1, 2, 4, 8))}, eps = 1e-6",
        f"    launch workgroup {c.choice((64, 128))}, subgroup >= {max(sub, 1)}{exchange}",
        f"    {tile}",
        f"    v0 = m[t, j + {lanes} * i] * s[0] + s[1]",
    ]
    for i in range(1, live):
        f = c.choice(("v{p} * v{p}", "exp(v{p} * 0.1)", "v{p} - s[2]", "tanh(v{p})"))
        lines.append(f"    v{i} = " + f.format(p=i - 1))
    both = " + ".join(f"v{i}" for i in range(live))
    lines.append(f"    r = sum(i: {both})")
    if lanes > 1 and c.chance(0.6):
        lines.append(f"    q = max(j: v0) + {c.choice(('sum(j: v0)', '1.0'))}")
        lines.append(f"    c = ({both}) / (r + eps) - q")
    else:
        lines.append(f"    c = ({both}) / (r + eps)")
    if loop:
        lines.append("    repeat iters:")
        lines.append("        c = c / (sum(i: c) + eps)")
        if lanes > 1:
            lines.append("        c = c / (sum(j: c) + eps)")
        else:
            lines.append("        c = c * 0.5 + 0.25")
    if live > 1 and c.chance(0.5):
        lines.append(f"    C[t, i, j] = c * v{live - 1} + v0")
    else:
        lines.append("    C[t, i, j] = c")
    return "\n".join(lines) + "\n"


def gen_softmax(c: Chooser, name: str) -> str:
    """One workgroup per row: scalar workgroup reductions and a scalar stage, then the row."""
    nq, cc = c.choice((4, 8, 32)), c.choice((256, 1024, 4096))
    scale = c.chance(0.5)
    lines = [
        f"region {name}(s: f32[NQ, C]) -> p: f32[NQ, C]",
        f"    const NQ = {nq}, C = {cc}",
        f"    launch workgroup {c.choice((64, 256, 512))}, subgroup any",
        "    per workgroup h < NQ",
        "    m = max(t: s[h, t]) @ workgroup",
        "    l = sum(t: exp(s[h, t] - m)) @ workgroup",
    ]
    if scale:
        lines.append("    r = 1.0 / l")
        lines.append("    p[h, t] = exp(s[h, t] - m) * r")
    else:
        lines.append("    p[h, t] = exp(s[h, t] - m) / l")
    return "\n".join(lines) + "\n"


def gen_head(c: Chooser, name: str) -> str:
    """One workgroup per head: a projection of the head's rows into shared memory (a contraction
    with a layout), a per-head norm, an elementwise output (qkv_rope's shape)."""
    dt = c.choice(("f32", "f16"))
    v = c.choice(VECTORS)
    hh, d, nh = c.choice((256, 512, 1024)), c.choice((32, 64, 128)), c.choice((2, 4, 8))
    norm = c.chance(0.5)
    lines = [
        f"region {name}(x: f32[H], W: {dt}[NH * D, H], qn: f32[D]) -> o: f32[NH, D]",
        f"    const H = {hh}, NH = {nh}, D = {d}, eps = 1e-6",
        "    " + _launch(c, wgs=(64, 128, 256)),
        "    per workgroup head < NH",
    ]
    operand = "x"
    if norm:
        lines.append("    ss = sum(j: x[j] * x[j]) @ workgroup in shared")
        lines.append("    xn[j] = x[j] * rsqrt(ss / H + eps) in shared")
        operand = "xn"
    lines.append(
        f"    p[d: D] = sum(j: W[head * D + d, j] * {operand}[j]) in shared "
        f"layout d -> subgroup, j -> lane x {v}"
    )
    lines.append("    hs = sum(d: p[d] * p[d]) @ workgroup in shared")
    lines.append("    o[head, d] = p[d] * qn[d] * rsqrt(hs / D + eps)")
    return "\n".join(lines) + "\n"


FAMILIES: dict[str, tuple[Callable[[Chooser, str], str], int]] = {
    "matvec": (gen_matvec, 7),
    "gated": (gen_gated, 3),
    "norm_matvec": (gen_norm_matvec, 3),
    "add_norm": (gen_add_norm, 1),
    "lane_rows": (gen_lane_rows, 2),
    "down": (gen_down, 2),
    "tile": (gen_tile, 4),
    "softmax": (gen_softmax, 1),
    "head": (gen_head, 2),
}


def family_of(name: str) -> str:
    return name.split("__", 1)[0]


def region_source(c: Chooser, name_prefix: str) -> str:
    """One region, named `<family>__<name_prefix>` (the family is recoverable from the name)."""
    names = list(FAMILIES)
    weights = [FAMILIES[n][1] for n in names]
    total = sum(weights)
    pick = c.integer(0, total - 1)
    for fam, w in zip(names, weights, strict=True):
        if pick < w:
            return FAMILIES[fam][0](c, f"{fam}__{name_prefix}")
        pick -= w
    raise AssertionError("unreachable")


@st.composite
def regions(draw: Callable[[st.SearchStrategy[Any]], Any], name: str = "h") -> str:
    """A hypothesis strategy of one region's source."""
    return region_source(DrawChooser(draw), name)


def case_source(seed: int, index: int) -> str:
    return region_source(RandomChooser(random.Random(f"{seed}:{index}")), f"s{seed}_{index}")


@dataclass(frozen=True)
class Case:
    seed: int
    index: int
    name: str
    family: str
    text: str


def corpus(seed: int, n: int, start: int = 0) -> list[Case]:
    out = []
    for i in range(start, start + n):
        text = case_source(seed, i)
        name = text.split("(", 1)[0].removeprefix("region ").strip()
        out.append(Case(seed, i, name, family_of(name), text))
    return out


# --- building ------------------------------------------------------------------------------------
@dataclass
class Built:
    """One batch built into `folder`: its manifest, the kernels to compile (distinct GLSL), and
    for every kernel of the manifest the key of the kernel whose statistics stand for it."""

    folder: Path
    cases: list[Case]
    manifest: mr.Manifest
    glsl: dict[str, str]  # kernel name -> GLSL
    key_of: dict[str, str]  # kernel name -> normalized-GLSL key
    distinct: list[tuple[str, str, bool, str]]  # (region, kernel, fused, variant), first of a key
    build_failed: dict[str, str]  # region name -> diagnostic


def glsl_key(text: str) -> str:
    """GLSL without the kernel's name and source lines: identical keys compile identically."""
    import hashlib

    body = "\n".join(ln for ln in text.splitlines() if not ln.startswith(("#line", "// kernel ")))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def _kernels(region: mr.Region) -> Iterable[tuple[mr.Kernel, bool, str]]:
    for k in region.fused:
        yield k, True, "fused"
    for k in region.fused_shared:
        yield k, True, "fused_shared"
    for k in region.unfused:
        yield k, False, "unfused"


def build_batch(cases: list[Case], folder: Path, seen: dict[str, str] | None = None) -> Built:
    """Build the cases as one `.fuse` file into `folder`; a batch that does not build is built
    region by region and the regions with diagnostics are left out (recorded).  `seen` (key ->
    kernel) carries distinct kernels across batches."""
    from fusec.codegen.build import build_source, write_build
    from fusec.dsl.diagnostics import DiagnosticError

    failed: dict[str, str] = {}
    ok = list(cases)
    text = "\n".join(c.text for c in ok)
    try:
        result = build_source(text, "corpus.fuse")
    except DiagnosticError:
        ok = []
        for c in cases:
            try:
                build_source(c.text, f"{c.name}.fuse")
                ok.append(c)
            except DiagnosticError as exc:
                failed[c.name] = str(exc)
        text = "\n".join(c.text for c in ok)
        result = build_source(text, "corpus.fuse")
    write_build(result, folder)
    glsl = {b.kernel.name: b.glsl for b in result.kernels}
    seen = {} if seen is None else seen
    key_of: dict[str, str] = {}
    distinct = []
    for region in result.manifest.regions:
        for k, fused, variant in _kernels(region):
            key = glsl_key(glsl[k.name])
            key_of[k.name] = key
            if key not in seen:
                seen[key] = k.name
                distinct.append((region.name, k.name, fused, variant))
    return Built(folder, ok, result.manifest, glsl, key_of, distinct, failed)


# --- the ACO worker ------------------------------------------------------------------------------
def worker_main(build_dir: str, waves: list[int], skip_file: str) -> int:
    """Child process: announce, compile and report every pipeline (one JSON line each)."""
    from fusec.codegen import manifest as mf
    from fusec.codegen import manifest_records as mr
    from fusec.runtime.actual import kernel_specs, kernel_statistics
    from fusec.runtime.device import Device

    folder = Path(build_dir)
    data = mr.Manifest.from_json(json.loads((folder / "manifest.json").read_text()))
    job = json.loads(Path(skip_file).read_text())
    only = {tuple(x) for x in job["todo"]}
    with Device(capture_statistics=True) as dev:
        if not dev.statistics:
            print(json.dumps({"fatal": f"{dev.info.name} reports no pipeline statistics"}))
            return 2
        for region in data.regions:
            spec = kernel_specs(region)
            defaults = {c.name: c.default for c in region.consts}
            for k, _, _ in _kernels(region):
                for wave in waves:
                    if (k.name, wave) not in only:
                        continue
                    print(json.dumps({"start": [k.name, wave]}), flush=True)
                    if not dev.info.min_subgroup_size <= wave <= dev.info.max_subgroup_size:
                        print(json.dumps({"kernel": k.name, "wave": wave, "error": "wave"}))
                        continue
                    derived = mf.derived_specs(k, defaults)
                    spv = (folder / k.spv).read_bytes()
                    stats = kernel_statistics(dev, spv, k, spec + derived, wave)
                    print(json.dumps({"kernel": k.name, "wave": wave, "stats": stats}), flush=True)
    return 0


def _why(stderr: str, rc: int) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for words in (("Unsupported", "Assertion", "Traceback"), ("error",)):
        for ln in lines:
            if any(w.lower() in ln.lower() for w in words):
                return f"{ln[:200]} (exit {rc})"
    return (lines[-1][:200] if lines else "no output") + f" (exit {rc})"


def aco_stats(
    folder: Path,
    todo: list[tuple[str, int]],
    env_extra: dict[str, str],
    timeout_s: float = 600,
) -> tuple[dict[tuple[str, int], dict[str, float]], dict[tuple[str, int], str]]:
    """Statistics for every (kernel, wave) of `todo`, and why for those the driver did not
    compile.  A child that dies mid-way is restarted past the pipeline it announced last."""
    stats: dict[tuple[str, int], dict[str, float]] = {}
    failed: dict[tuple[str, int], str] = {}
    waves = sorted({w for _, w in todo})
    env = {**os.environ, **env_extra}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    remaining = list(todo)
    while remaining:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"todo": remaining}, f)
        started: tuple[str, int] | None = None
        try:
            proc = subprocess.run(
                [
                    sys.executable,
                    *("-m", "tests.estimator.corpus", "worker", str(folder)),
                    *(",".join(map(str, waves)), f.name),
                ],
                capture_output=True,
                text=True,
                env=env,
                cwd=ROOT,
                timeout=timeout_s,
            )
            out, err, rc = proc.stdout, proc.stderr, proc.returncode
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            err, rc = "timeout", -9
        finally:
            os.unlink(f.name)
        for line in out.splitlines():
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "start" in msg:
                started = (msg["start"][0], int(msg["start"][1]))
            elif "stats" in msg:
                stats[(msg["kernel"], int(msg["wave"]))] = msg["stats"]
                started = None
            elif "error" in msg:
                failed[(msg["kernel"], int(msg["wave"]))] = msg["error"]
                started = None
            elif "fatal" in msg:
                for key in remaining:
                    failed.setdefault(key, msg["fatal"])
        if rc != 0 and started is not None:
            failed[started] = _why(err, rc)
        elif rc != 0:  # died before its first pipeline: nothing more will compile
            for key in remaining:
                if key not in stats:
                    failed.setdefault(key, _why(err, rc))
        remaining = [k for k in remaining if k not in stats and k not in failed]
    return stats, failed


# --- comparison ----------------------------------------------------------------------------------
def glsl_shape(text: str) -> dict[str, int]:
    """What a kernel's GLSL holds that makes register demand hard to predict."""
    import re

    body = text.split("void main()", 1)[-1]
    return {
        "lines": len([ln for ln in body.splitlines() if ln.strip() and not ln.startswith("#")]),
        "private_arrays": len(re.findall(r"^\s+\w+ \w+\[[^\]]+\];", body, re.M)),
        "unrolled_loops": body.count("[[unroll]]"),
        "loops": len(re.findall(r"\bfor \(", body)),
        "vec4_loads": len(re.findall(r"\b(u?vec4|f16vec4|uvec4)\(", body))
        + len(re.findall(r"b_\w+_(?:u4|v4|f4)\[", body)),
        "shuffles": len(re.findall(r"subgroupShuffle", body)),
        "subgroup_ops": len(re.findall(r"subgroup(Add|Max|Min)", body)),
        "barriers": body.count("barrier()"),
        "atomics": len(re.findall(r"atomic", body)),
        "dot4": len(re.findall(r"dot(Packed)?4x8|dotEXT|dot4", body)),
    }


def _row_for(
    built: Built,
    region: mr.Region,
    k: mr.Kernel,
    fused: bool,
    variant: str,
    target: str,
    wave: int,
    st_: dict[str, float] | None,
    why: str | None,
) -> dict[str, Any]:
    from fusec.codegen.targets import TARGETS, occupancy

    est = k.estimate(target, wave)
    assert est is not None
    row: dict[str, Any] = {
        "region": region.name,
        "family": family_of(region.name),
        "kernel": k.name,
        "fused": fused,
        "variant": variant,
        "target": target,
        "wave": wave,
        "workgroup": k.workgroup_size,
        "est_vgprs": est.vgprs,
        "est_waves": est.waves_per_simd,
        "est_spills": est.spills > 0,
        "est_lds": est.lds_bytes,
        "est_uncertain": est.uncertain,
        "status": "ok" if st_ is not None else "aco_failed",
        "aco_error": why,
    }
    if st_ is not None:
        presched = int(st_["Pre-Sched VGPRs"])
        row.update(
            presched=presched,
            aco_vgprs=int(st_["VGPRs"]),
            aco_spilled=int(st_["Spilled VGPRs"]),
            aco_spills=st_["Spilled VGPRs"] > 0,
            aco_lds=int(st_["LDS size"]),
            aco_waves=occupancy(
                TARGETS[target], wave, int(st_["VGPRs"]), int(st_["LDS size"]), k.workgroup_size
            ),
            demand_err=est.vgprs - presched,
        )
    return row


@dataclass
class Result:
    rows: list[dict[str, Any]]  # one per distinct kernel, target and wave
    verdicts: list[dict[str, Any]]  # one per region, target and wave
    kernels_total: int  # kernels in the manifests (duplicates included)
    kernels_distinct: int
    build_failed: dict[str, str]
    cases: list[Case]
    glsl: dict[str, str]  # kernel -> GLSL, for the distinct kernels
    not_selected: int = 0  # distinct unfused kernels left out by `balanced`
    duplicates: int = 0  # kernels whose GLSL another kernel of the corpus has


def compare(
    cases: list[Case],
    pairs: Sequence[tuple[str, int]],
    workdir: Path,
    jobs: int = 2,
    batch: int = BATCH_REGIONS,
    progress: Callable[[str], None] | None = None,
    balanced: bool = False,
) -> Result:
    """Build the cases in batches and hold every distinct kernel against ACO on `pairs`.

    `balanced`: compare the unfused chains of the first regions only (in case order), as many
    as keep the unfused kernels at most as many as the fused ones; the others are counted in
    `Result.not_selected`.  Every fused kernel is always compared."""
    from fusec.codegen.budget import budget_for
    from fusec.runtime.actual import radv_env

    seen: dict[str, str] = {}
    builts = []
    for b0 in range(0, len(cases), batch):
        folder = workdir / f"batch{b0 // batch:04d}"
        builts.append(build_batch(cases[b0 : b0 + batch], folder, seen))
        if progress:
            progress(f"built batch {b0 // batch}")
    not_selected = 0
    if balanced:
        room = sum(fused for b in builts for _, _, fused, _ in b.distinct)
        for b in builts:
            chains: dict[str, list[tuple[str, str, bool, str]]] = {}
            for d in b.distinct:
                if not d[2]:
                    chains.setdefault(d[0], []).append(d)
            for region, chain in chains.items():
                if len(chain) <= room:
                    room -= len(chain)
                else:
                    b.distinct = [d for d in b.distinct if d[0] != region or d[2]]
                    room = -1  # the first region left out ends the selection
                    not_selected += len(chain)
    targets = sorted({t for t, _ in pairs})
    tasks = []
    for bi, b in enumerate(builts):
        for t in targets:
            todo = [(kn, w) for _, kn, _, _ in b.distinct for tt, w in pairs if tt == t]
            tasks.append((bi, t, todo))

    def run(task: tuple[int, str, list[tuple[str, int]]]) -> Any:
        bi, t, todo = task
        env = radv_env(t)
        assert env is not None, "RADV is not installed"
        out = aco_stats(builts[bi].folder, todo, env)
        if progress:
            progress(f"batch {bi} {t}: {len(out[0])} compiled, {len(out[1])} failed")
        return out

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        outs = list(pool.map(run, tasks))
    stats: dict[tuple[str, str, int], dict[str, float]] = {}
    fails: dict[tuple[str, str, int], str] = {}
    for (_, t, _), (s, f) in zip(tasks, outs, strict=True):
        stats.update({(t, kn, w): v for (kn, w), v in s.items()})
        fails.update({(t, kn, w): v for (kn, w), v in f.items()})

    rows: list[dict[str, Any]] = []
    verdicts: list[dict[str, Any]] = []
    glsl: dict[str, str] = {}
    by_key: dict[tuple[str, str, int], dict[str, Any]] = {}
    total = 0
    for b in builts:
        first = {kn for _, kn, _, _ in b.distinct}
        for region in b.manifest.regions:
            for k, fused, variant in _kernels(region):
                total += 1
                if k.name not in first:
                    continue
                glsl[k.name] = b.glsl[k.name]
                for t, w in pairs:
                    r = _row_for(
                        b, region, k, fused, variant, t, w,
                        stats.get((t, k.name, w)), fails.get((t, k.name, w)),
                    )  # fmt: skip
                    r["key"] = b.key_of[k.name]
                    rows.append(r)
                    by_key[(r["key"], t, w)] = r
        for region in b.manifest.regions:
            for t, w in pairs:
                budget = budget_for(t, region.budget)
                verdict = region.verdict(t, w)
                assert verdict is not None
                fused_rows = [by_key[(b.key_of[k.name], t, w)] for k in region.fused]
                ok = [r for r in fused_rows if r["status"] == "ok"]
                for r in fused_rows:  # a fused kernel is accepted when its region's verdict is
                    r["accepted"] = r.get("accepted", False) or verdict.accepted
                    r["budget_waves"] = budget.min_waves
                    r["budget_spills"] = budget.max_spills
                verdicts.append(
                    {
                        "region": region.name,
                        "target": t,
                        "wave": w,
                        "accepted": verdict.accepted,
                        "reason": verdict.reason,
                        "budget_waves": budget.min_waves,
                        "aco_failed": len(ok) < len(fused_rows),
                        "aco_spills": any(r["aco_spilled"] > budget.max_spills for r in ok),
                        "aco_under_waves": any(r["aco_waves"] < budget.min_waves for r in ok),
                        "aco_over_vgprs": any(r["presched"] > budget.max_vgprs for r in ok),
                    }
                )
    failed = {n: why for b in builts for n, why in b.build_failed.items()}
    distinct = len(rows) // max(len(pairs), 1)
    dups = total - distinct - not_selected
    return Result(rows, verdicts, total, distinct, failed, cases, glsl, not_selected, dups)


# --- figures -------------------------------------------------------------------------------------
def demand_close(r: dict[str, Any]) -> bool:
    return bool(abs(r["est_vgprs"] - r["presched"]) <= max(4, 0.10 * r["presched"]))


def _share(n: int, d: int) -> float:
    return n / d if d else math.nan


def _accepted_spilling(r: dict[str, Any]) -> bool:
    return bool(r.get("accepted")) and r["aco_spilled"] > r["budget_spills"]


def _accepted_under(r: dict[str, Any]) -> bool:
    return bool(r.get("accepted")) and r["aco_waves"] < r["budget_waves"]


def summarize(
    rows: list[dict[str, Any]], verdicts: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Per (target, wave): the figures of the report.  Accepted-but-spilling and
    accepted-but-under-budget count fused kernels (rows); with `verdicts`, regions too."""
    out = []
    pairs = sorted({(r["target"], r["wave"]) for r in rows})
    for t, w in pairs:
        rs = [r for r in rows if r["target"] == t and r["wave"] == w]
        ok = [r for r in rs if r["status"] == "ok"]
        vs = [v for v in verdicts or [] if v["target"] == t and v["wave"] == w]
        acc = [v for v in vs if v["accepted"]]
        out.append(
            {
                "target": t,
                "wave": w,
                "kernels": len(rs),
                "fused": sum(r["fused"] for r in rs),
                "unfused": sum(not r["fused"] for r in rs),
                "aco_failed": len(rs) - len(ok),
                "demand_close": _share(sum(demand_close(r) for r in ok), len(ok)),
                "demand_close_fused": _share(
                    sum(demand_close(r) for r in ok if r["fused"]), sum(r["fused"] for r in ok)
                ),
                "under": sum(r["demand_err"] < 0 and not demand_close(r) for r in ok),
                "over": sum(r["demand_err"] > 0 and not demand_close(r) for r in ok),
                "waves_exact": _share(sum(r["est_waves"] == r["aco_waves"] for r in ok), len(ok)),
                "waves_high": sum(r["est_waves"] > r["aco_waves"] for r in ok),
                "spills_agree": _share(
                    sum(r["est_spills"] == r["aco_spills"] for r in ok), len(ok)
                ),
                "spills_missed": sum(r["aco_spills"] and not r["est_spills"] for r in ok),
                "spills_false": sum(r["est_spills"] and not r["aco_spills"] for r in ok),
                "uncertain_fused": sum(bool(r["est_uncertain"]) for r in ok if r["fused"]),
                "accepted_kernels": sum(bool(r.get("accepted")) for r in ok),
                "accepted_spilling": sum(_accepted_spilling(r) for r in ok),
                "accepted_under_waves": sum(_accepted_under(r) for r in ok),
                "regions": len(vs),
                "regions_accepted": len(acc),
                "regions_accepted_spilling": sum(v["aco_spills"] for v in acc),
                "regions_accepted_under_waves": sum(v["aco_under_waves"] for v in acc),
                "refused_but_fits": sum(
                    not v["accepted"]
                    and not v["aco_failed"]
                    and not (v["aco_spills"] or v["aco_under_waves"] or v["aco_over_vgprs"])
                    for v in vs
                ),
            }
        )
    return out


def acceptance_failures(rows: list[dict[str, Any]]) -> list[str]:
    """The estimator's acceptance thresholds, per (target, wave); empty when all hold:
    demand within max(4, 10%) of ACO's Pre-Sched VGPRs for >= 95% of kernels, waves exact for
    >= 95%, spill yes/no agreeing for 100%, and no fusion accepted that ACO spills or puts
    under the budget's waves."""
    out = []
    for s in summarize(rows):
        where = f"{s['target']} wave{s['wave']}"
        if not s["demand_close"] >= 0.95:
            out.append(f"{where}: demand within max(4, 10%) for {s['demand_close']:.1%} < 95%")
        if not s["waves_exact"] >= 0.95:
            out.append(f"{where}: waves exact for {s['waves_exact']:.1%} < 95%")
        if s["spills_agree"] != 1.0:
            out.append(
                f"{where}: spill prediction wrong for {s['spills_missed']} missed and "
                f"{s['spills_false']} false kernels"
            )
        if s["accepted_spilling"]:
            out.append(f"{where}: {s['accepted_spilling']} accepted fusions ACO spills")
        if s["accepted_under_waves"]:
            out.append(
                f"{where}: {s['accepted_under_waves']} accepted fusions ACO puts under the "
                "budget's waves"
            )
    return out


def worst(result: Result, n: int = 10, pair: tuple[str, int] | None = None) -> list[dict[str, Any]]:
    """The n kernels with the largest demand error (one row per kernel: its worst pair)."""
    best: dict[str, dict[str, Any]] = {}
    for r in result.rows:
        if r["status"] != "ok" or (pair is not None and (r["target"], r["wave"]) != pair):
            continue
        cur = best.get(r["kernel"])
        if cur is None or abs(r["demand_err"]) > abs(cur["demand_err"]):
            best[r["kernel"]] = r
    return sorted(best.values(), key=lambda r: -abs(r["demand_err"]))[:n]


def source_of(result: Result, region: str) -> str:
    return next(c.text for c in result.cases if c.name == region)


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        sys.exit(worker_main(sys.argv[2], [int(w) for w in sys.argv[3].split(",")], sys.argv[4]))
    print(__doc__)
