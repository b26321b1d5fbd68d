"""The numpy reference: runs a region's semantics on numpy arrays, accumulating in float64.

Input: an `ir.Region`, constant values and input arrays.  Output: every output array, in its dtype.
Independent of codegen: placements, layouts and scopes do not change the value, so they are ignored.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from . import bounds, ir
from .q8_0x import q8_0x_values, quantize_q8_0x
from .types import EXCHANGE_FUNCTIONS, QUANT_BLOCK, DType

F64 = npt.NDArray[np.float64]
NUMPY_DTYPES: dict[DType, type[np.generic]] = {
    DType.F32: np.float32,
    DType.F16: np.float16,
    DType.U32: np.uint32,
    DType.I32: np.int32,
}


def _sigmoid(x: F64) -> F64:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _exp(x: F64) -> F64:
    # overflow to inf, as on the GPU; `select` evaluates both of its branches, so a masked
    # exp(s - max) of a fully masked row must not warn
    with np.errstate(over="ignore"):
        return np.exp(x)


def _pow(x: F64, y: F64) -> F64:
    # GLSL's pow is undefined for x < 0 (GLSL 4.60, 8.2: it is exp2(y * log2(x)), and lavapipe
    # returns NaN), so the reference does not claim (-2)^2 = 4 either: NaN, as for the log of a
    # negative (docs/FUZZING.md)
    # likewise for x = 0 with y <= 0 (undefined there), and for x = 1 with an infinite y, where
    # exp2(inf * log2(1)) = exp2(NaN) (a case the front-end fuzzer found, seed 1 case 6550)
    undefined = (x < 0) | ((x == 0) & (y <= 0)) | ((x == 1) & np.isinf(y))
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.where(undefined, np.nan, np.power(x, y))


_erf = np.vectorize(math.erf, otypes=[np.float64])
_SQRT_HALF = math.sqrt(0.5)
_GELU_TANH_C = math.sqrt(2.0 / math.pi)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = 0.5 * x * (1.0 + np.tanh(_GELU_TANH_C * (x + 0.044715 * x * x * x)))
    return out


_FUNCS: dict[str, Any] = {
    "exp": _exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "rsqrt": lambda x: 1.0 / np.sqrt(x),
    "abs": np.abs,
    "tanh": np.tanh,
    "sin": np.sin,
    "cos": np.cos,
    "sigmoid": _sigmoid,
    "silu": lambda x: x * _sigmoid(x),
    "erf": _erf,
    # Hendrycks and Gimpel, "Gaussian Error Linear Units (GELUs)", arXiv:1606.08415, section 2:
    # x * Phi(x) = x / 2 * (1 + erf(x / sqrt 2)), and the approximation with tanh
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x * _SQRT_HALF)),
    "gelu_tanh": _gelu_tanh,
    "softplus": lambda x: np.logaddexp(0.0, x),
    "float": lambda x: x,
    "clamp": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
    "max": np.maximum,
    "min": np.minimum,
    "pow": _pow,
    "select": lambda c, a, b: np.where(c != 0, a, b),
}


class _Evaluator:
    def __init__(
        self,
        consts: Mapping[str, int | float],
        arrays: dict[str, np.ndarray],
        real: type[np.floating[Any]] = np.float64,
        tile: ir.Tile | None = None,
    ) -> None:
        self.consts = consts
        self.arrays = arrays  # inputs and computed stages, in `real` (ints as int64)
        self.real = real
        self.tile = tile  # the region's tile: where shuffle_xor, shuffle, broadcast read
        self.axes: dict[ir.IndexVar, int] = {}
        self.ndim = 0

    def index_array(self, var: ir.IndexVar) -> np.ndarray:
        extent = ir.evaluate_int(var.extent, dict(self.consts))
        shape = [1] * self.ndim
        shape[self.axes[var]] = extent
        return np.arange(extent, dtype=np.int64).reshape(shape)

    def gather(self, arr: np.ndarray, indices: tuple[ir.Expr, ...]) -> np.ndarray:
        if not indices:
            return np.asarray(arr).reshape([1] * self.ndim)
        vars_ = [i.var for i in indices if isinstance(i, ir.IndexRef)]
        if len(vars_) == len(indices) and len(set(vars_)) == len(vars_):
            # fast path: plain distinct index variables -> a transposed view, no gather (an
            # index declared shorter than the dimension reads the leading sub-range)
            extents = [ir.evaluate_int(v.extent, dict(self.consts)) for v in vars_]
            arr = arr[tuple(slice(0, e) for e in extents)]
            order = sorted(range(len(vars_)), key=lambda d: self.axes[vars_[d]])
            view = np.transpose(arr, order)
            shape = [1] * self.ndim
            for d in order:
                shape[self.axes[vars_[d]]] = arr.shape[d]
            return view.reshape(shape)
        idx = [np.asarray(self.eval(i)).astype(np.int64) for i in indices]
        return arr[tuple(np.broadcast_arrays(*idx))]

    def eval(self, e: ir.Expr) -> np.ndarray:
        match e:
            case ir.Lit(v, dtype):
                return np.asarray(v, dtype=np.int64 if dtype.is_int else self.real)
            case ir.ConstRef(c):
                v = self.consts[c.name]
                return np.asarray(v, dtype=np.int64 if c.dtype.is_int else self.real)
            case ir.IndexRef(var):
                return self.index_array(var)
            case ir.Load(buf, idx):
                return self.gather(self.arrays[buf.name], idx)
            case ir.StageRef(stage, idx):
                return self.gather(self.arrays[stage.name], idx)
            case ir.Call(fn, (value, ir.Lit(lane)), _) if fn in EXCHANGE_FUNCTIONS:
                return self.exchange(fn, value, int(lane))
            case ir.Call(fn, args, _):
                vals = [np.asarray(self.eval(a), dtype=self.real) for a in args]
                return np.asarray(_FUNCS[fn](*vals), dtype=self.real)
            case ir.BinOp(op, lhs, rhs, dtype):
                a, b = self.eval(lhs), self.eval(rhs)
                if op in ("<", "<=", ">", ">=", "==", "!="):
                    res = {
                        "<": a < b,
                        "<=": a <= b,
                        ">": a > b,
                        ">=": a >= b,
                        "==": a == b,
                        "!=": a != b,
                    }[op]
                    return np.asarray(res, dtype=self.real)
                if dtype.is_int:
                    a, b = a.astype(np.int64), b.astype(np.int64)
                    if op == "/":
                        return a // b
                    if op == "%":
                        return a % b
                else:
                    a, b = a.astype(self.real), b.astype(self.real)
                return {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[op](a, b)
            case ir.Neg(v):
                return -self.eval(v)
            case ir.Reduce(op, var, body, _, k=k, rank=rank):
                # the rank of a topk, at the stage's own axes (the body never reads it)
                at = None if rank is None else np.asarray(self.eval(rank)).astype(np.int64)
                axis = self.ndim
                self.axes[var] = axis
                self.ndim += 1
                try:
                    val = np.asarray(self.eval(body), dtype=self.real)
                    val = val.reshape(val.shape + (1,) * (self.ndim - val.ndim))
                    extent = ir.evaluate_int(var.extent, dict(self.consts))
                    val = np.broadcast_to(val, (*val.shape[:axis], extent, *val.shape[axis + 1 :]))
                    if at is not None:
                        assert k is not None
                        count = ir.evaluate_int(k, dict(self.consts))
                        return _select_topk(op, val, count, at)
                    reducer: Any = {
                        "sum": np.sum,
                        "max": np.max,
                        "min": np.min,
                        # the first index of the largest (smallest) value: ties go to the lowest
                        "argmax": np.argmax,
                        "argmin": np.argmin,
                    }[op]
                    red = reducer(val, axis=axis)
                finally:
                    del self.axes[var]
                    self.ndim -= 1
                return np.asarray(red)
        raise AssertionError(e)

    def exchange(self, fn: str, value: ir.Expr, lane: int) -> np.ndarray:
        """`value` at the partner lane of each tile element: lane ^ `lane` (shuffle_xor) or lane
        `lane` of the group (shuffle, broadcast).  The tile's lane indices sit on their own
        lane bits (lane = sum of index * stride), so the partner's coordinates are the
        element's, each lane index replaced by its bits of the partner lane; slot indices and
        the group's `per` index stay."""
        tile = self.tile
        assert tile is not None, "the checker allows exchanges in tile regions only"
        v = np.asarray(self.eval(value), dtype=self.real)
        v = v.reshape(v.shape + (1,) * (self.ndim - v.ndim))
        extents = {var: ir.evaluate_int(var.extent, dict(self.consts)) for var in self.axes}
        shape = [1] * self.ndim
        for var, axis in self.axes.items():
            shape[axis] = extents[var]
        v = np.broadcast_to(v, shape)
        # by name: a reduction over a tile index binds a variable of its own, of the same name
        strides = {d.name: st for d, st in zip(tile.dims, tile.strides, strict=True)}
        # an axis no variable names now (a reduction over a tile index rebinds its name) has
        # extent 1 here
        idx = [np.zeros([1] * self.ndim, dtype=np.int64) for _ in range(self.ndim)]
        for var, axis in self.axes.items():
            coord = self.index_array(var)
            stride = strides.get(var.name, 0)
            if stride:
                width = 1 << max(0, extents[var] - 1).bit_length()  # the index's lane bits
                bits = (lane // stride) % width
                coord = coord ^ bits if fn == "shuffle_xor" else np.full_like(coord, bits)
            idx[axis] = coord
        return v[tuple(np.broadcast_arrays(*idx))]

    def stage(self, stage: ir.Stage) -> np.ndarray:
        self.axes = {v: i for i, v in enumerate(stage.indices)}
        self.ndim = len(stage.indices)
        dtype = np.int64 if stage.dtype.is_int else self.real
        val = np.asarray(self.eval(stage.value), dtype=dtype)
        shape = tuple(ir.evaluate_int(v.extent, dict(self.consts)) for v in stage.indices)
        val = val.reshape(val.shape + (1,) * (self.ndim - val.ndim))
        return np.broadcast_to(val, shape).copy()


def _select_topk(op: str, val: np.ndarray, k: int, rank: np.ndarray) -> np.ndarray:
    """The `rank`-th of the k largest values of `val` along its last axis (`argtopk`: its
    index), largest first; equal values in index order (a stable sort: the lowest index
    first)."""
    order = np.argsort(-val, axis=-1, kind="stable")[..., :k]
    picked = order if op == "argtopk" else np.take_along_axis(val, order, axis=-1)
    shape = np.broadcast_shapes(picked.shape[:-1], rank.shape)
    picked = np.broadcast_to(picked, (*shape, k))
    where = np.broadcast_to(rank, shape)[..., None]
    return np.asarray(np.take_along_axis(picked, where, axis=-1)[..., 0])


def _gguf_type(dtype: DType) -> Any:
    from gguf import GGMLQuantizationType

    return GGMLQuantizationType[dtype.value.upper()]


def quantize(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Float weights -> GGUF block bytes (uint8, rows of blocks), with the gguf package
    (NotImplementedError for a dtype the installed gguf cannot quantize: `weight_blocks`)."""
    from gguf import quants

    return np.asarray(quants.quantize(np.ascontiguousarray(values, np.float32), _gguf_type(dtype)))


def dequantize(blocks: np.ndarray, dtype: DType) -> np.ndarray:
    """GGUF block bytes -> float32 values, with the gguf package (the reference for our
    kernels' dequantization)."""
    from gguf import quants

    return np.asarray(quants.dequantize(blocks, _gguf_type(dtype)))


def weight_blocks(values: np.ndarray, dtype: DType, rng: np.random.Generator) -> np.ndarray:
    """Block bytes of a test weight (uint8, rows of blocks): `values` quantized with gguf
    where the installed gguf can; otherwise random valid blocks of the same magnitude."""
    try:
        return quantize(values, dtype)
    except NotImplementedError:
        return random_blocks(rng, dtype, values)


def random_blocks(rng: np.random.Generator, dtype: DType, values: np.ndarray) -> np.ndarray:
    """Valid K-quant blocks (gguf 0.19 cannot quantize them) for weights shaped like `values`:
    random bytes for every quant and 6-bit or int8 scale, and finite positive f16 super-block
    scales chosen so that a block's values lie within its largest |value| in `values`."""
    f32 = np.asarray(values, np.float32)
    blocks = f32.reshape(-1, dtype.block)
    n = blocks.shape[0]
    raw = rng.integers(0, 256, size=(n, dtype.block_bytes), dtype=np.uint8)
    top = np.abs(blocks).max(axis=1)
    top[top == 0] = 1.0

    def f16(x: np.ndarray) -> np.ndarray:
        # at most 0.99 x: f16 rounding (2^-11 relative) keeps the bound
        return (x * rng.uniform(0.5, 0.99, n)).astype(np.float16).view(np.uint8).reshape(n, 2)

    if dtype == DType.Q4_K:  # d * scale * q - dmin * min, scale and min < 64, q < 16
        raw[:, 0:2] = f16(top / (63 * 15))
        raw[:, 2:4] = f16(top / (63 * 2))  # values mostly in -top / 2 .. top, mean near 0
    elif dtype == DType.Q6_K:  # d * scale * (q - 32), |scale| <= 128, |q - 32| <= 32
        raw[:, 208:210] = f16(top / (128 * 32))
    else:
        raise NotImplementedError(f"random blocks of {dtype.value}")
    return raw.reshape(*f32.shape[:-1], -1)


# Where the reference's value lies this close to a q8_0 rounding boundary (relative to the
# quant, at least 1), the device's f32 arithmetic (a sum in another order, rsqrt within its
# ulps) can land it on the other side: `round_to_blocks` then takes the device's quant if it is
# one of the two neighbours.  2^-16 covers several f32 ulps of the value and of the scale.
TIE_MARGIN = 2.0**-16


def round_to_blocks(
    values: np.ndarray, dtype: DType, device: np.ndarray | None = None
) -> np.ndarray:
    """A stage stored `as q8_0`: its f32 values quantized to 32-element blocks along the last
    axis (the last block padded with zeros) and dequantized, with the gguf package.  `device`:
    the same stage as a device rounded it (dequantized, `values`' shape); where a q8_0 value
    is within TIE_MARGIN of a rounding boundary and the device took the neighbouring quant,
    the device's is kept (rounding at a boundary itself is tested bit-exact apart)."""
    n = values.shape[-1]
    padded = -(-n // QUANT_BLOCK) * QUANT_BLOCK
    f32 = np.zeros((*values.shape[:-1], padded), np.float32)
    f32[..., :n] = values
    rounded = dequantize(quantize(f32, dtype), dtype).reshape(f32.shape)
    out = np.asarray(rounded[..., :n], dtype=np.float64)
    if device is None or dtype != DType.Q8_0:
        return out
    blocks = f32.reshape(*f32.shape[:-1], -1, QUANT_BLOCK).astype(np.float64)
    scale = np.abs(blocks).max(axis=-1, keepdims=True) / 127.0
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.abs(np.where(scale > 0, blocks / scale, 0.0))
    near = np.abs(q - np.floor(q) - 0.5) < TIE_MARGIN * np.maximum(q, 1.0)
    with np.errstate(over="ignore"):  # the dequantized step: the scale as gguf stores it, f16
        stored = scale.astype(np.float16).astype(np.float64)
    step = np.broadcast_to(stored, blocks.shape).reshape(f32.shape)[..., :n]
    near = near.reshape(f32.shape)[..., :n]
    dev = np.asarray(device, np.float64).reshape(out.shape)
    neighbour = np.isfinite(dev) & (np.abs(dev - out) <= 1.001 * step)
    return np.where(near & neighbour, dev, out)


def const_values(
    region: ir.Region, overrides: Mapping[str, int | float] | None = None
) -> dict[str, int | float]:
    """Constant values: defaults, replaced by `overrides`."""
    values: dict[str, int | float] = {c.name: c.default for c in region.consts}
    values.update(overrides or {})
    return values


def shape_of(buf: ir.Buffer, consts: Mapping[str, int | float]) -> tuple[int, ...]:
    return tuple(ir.evaluate_int(d, dict(consts)) for d in buf.shape)


def run_reference(
    region: ir.Region,
    inputs: Mapping[str, np.ndarray],
    consts: Mapping[str, int | float] | None = None,
    real: type[np.floating[Any]] = np.float64,
    device_rounded: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Evaluate `region` on `inputs`; returns every output, cast to its dtype.  `real` is the
    float type every value is computed in: float64 is the reference; float32 is what a GPU
    kernel could at best compute, which tells an ill-conditioned input apart (the fuzzer's
    checker, docs/FUZZING.md).  `device_rounded`: stages stored `as q8_0`, as a device rounded
    them, to settle values within TIE_MARGIN of a boundary (`round_to_blocks`)."""
    values = const_values(region, consts)
    arrays: dict[str, np.ndarray] = {}
    for buf in region.inputs:
        a = np.asarray(inputs[buf.name])
        if buf.dtype.is_quantized:
            a = dequantize(a, buf.dtype).reshape(shape_of(buf, values))
        elif buf.dtype == DType.Q8_0X:  # fusec's aligned q8_0 blocks, read through gguf
            a = q8_0x_values(a, shape_of(buf, values)[0])
        arrays[buf.name] = a.astype(np.int64 if buf.dtype.is_int else real)
    ev = _Evaluator(values, arrays, real, region.tile)
    outputs: dict[str, np.ndarray] = {}

    for buf in region.outputs:
        if buf.state:  # kept between runs: starts from its earlier contents
            outputs[buf.name] = np.array(inputs[buf.name], dtype=NUMPY_DTYPES[buf.dtype])

    def run(stage: ir.Stage) -> None:
        result = ev.stage(stage)
        out = stage.output
        if out is not None and out.dtype == DType.Q8_0X:
            # an output stored as q8_0 blocks: the bytes of the unrounded values, rounded once
            outputs[out.name] = quantize_q8_0x(result)
        if stage.stored is not None:
            device = (device_rounded or {}).get(stage.name)
            result = round_to_blocks(result, stage.stored, device).astype(real)
        arrays[stage.name] = result
        if out is None or out.dtype == DType.Q8_0X:
            return
        if stage.out_index is None:
            outputs[out.name] = result.astype(NUMPY_DTYPES[out.dtype])
            return
        if stage.writes_part:
            write_part(stage, result)
            return
        # part of a state output: fixed positions take an integer, the stage's indices a range
        where = tuple(
            slice(0, ir.evaluate_int(i.var.extent, dict(values)))
            if isinstance(i, ir.IndexRef)
            else ir.evaluate_int(i, dict(values))
            for i in stage.out_index
        )
        outputs[out.name][where] = result.astype(NUMPY_DTYPES[out.dtype])

    def write_part(stage: ir.Stage, result: np.ndarray) -> None:
        """The elements the mask admits, each at its computed index (dsl/check_writes.py)."""
        out = stage.output
        assert out is not None and stage.out_index is not None
        if out.name not in outputs:  # the first of the stages sharing it (checked: no gaps)
            blank = 0 if out.dtype.is_int else np.nan
            outputs[out.name] = np.full(shape_of(out, values), blank, NUMPY_DTYPES[out.dtype])
        shape = result.shape
        axes = {
            v: np.arange(n, dtype=np.int64).reshape(
                [-1 if k == i else 1 for k in range(len(shape))]
            )
            for i, (v, n) in enumerate(zip(stage.indices, shape, strict=True))
        }
        keep = np.ones(shape, dtype=bool)
        if stage.mask is not None:
            keep = np.broadcast_to(bounds.grid_value(stage.mask, values, axes) != 0, shape)
        where = tuple(
            np.broadcast_to(bounds.grid_value(i, values, axes).astype(np.int64), shape)[keep]
            for i in stage.out_index
        )
        outputs[out.name][where] = result[keep].astype(NUMPY_DTYPES[out.dtype])

    for item in region.stages:
        if isinstance(item, ir.Repeat):
            for _ in range(ir.evaluate_int(item.count, dict(values))):
                for stage in item.stages:
                    run(stage)
                for top, last in item.carried:  # the next iteration reads the body's last value
                    arrays[top.name] = arrays[last.name]
        else:
            run(item)
    return outputs
