"""The one GLSL expression printer (`_Printer`, fully parenthesized) and what it prints with:
the loop-unroll hints, GLSL names of user buffers, shared arrays and index variables (mangled
where a generated name could equal them), float and double literals, and the derived constants
(integer divisions of specialization constants) hoisted to spec constants.

Input: kernel-IR expressions.  Output: GLSL expression text.  Not done here: statements,
loops and phases (`glsl.py` and its `glsl_*` mixins)."""

from __future__ import annotations

import contextvars
import re

import attrs

from fusec.dsl import ir
from fusec.dsl.types import DType

from . import kir
from .glsl_templates import _CALLED, _F64_FN, _FUNCTION_NEEDS, _FUNCTION_TEXT, _UNARY_FN

# Workgroup-strided loops (a workgroup reduction, a shared fill) carry an unroll hint: their
# trip count is fixed by specialization constants, and unrolled they issue their loads together
# (H200: RMSNorm + matvec 15.8 -> 12.8 us, docs/BENCHMARKS.md).
LOOP_HINT = "[[unroll]] "
# A loop of one lane over an index (a lane reduction, a tile's `repeat`), as the plan has it
# (`plan.KernelPlan.lane_loop`): unrolled here, or kept a loop whatever the driver would do.
SERIAL_HINT = {True: "[[unroll]] ", False: "[[dont_unroll]] "}


# User names reach GLSL behind a prefix that says what they name (b_ buffer, s_ shared array,
# v_ local, c_ constant, i_ index; per quantized buffer quant_W, blk_W, ...), and some generated
# names extend a user name or share its prefix: b_W_u4 (buffer W read as uvec4), s_xn_q and
# s_xn_d (a q8_0 stage's blocks), s_reduce, s_exchange, dot_ss, dot_su, and i_t_src_dst (the
# flattened index of a stage over t, src and dst).  A user name that one of them could equal is
# mangled to its length followed by itself (`W_u4` -> b_4W_u4): after a prefix only a mangled
# name starts with a digit, and the length keeps the mangling one-to-one.  Every other name is
# printed as written, so kernels without such names read as they always did.
_BUFFER_SUFFIX = re.compile(r"_u[0-9]+$")  # b_<buffer>_u4: a wide view
_WEIGHT_WORDS = frozenset(("ss", "su"))  # dot_<quantized buffer> against dot_ss, dot_su
_SHARED_SUFFIX = re.compile(r"_[qd]$")  # s_<stage>_q, s_<stage>_d: q8_0 blocks
_SHARED_WORDS = frozenset(("reduce", "exchange"))  # s_reduce, s_exchange
_SHARED_ADDED = re.compile(r"^(reduce_i|tk[0-9]+(_i)?)$")  # s_reduce_i, s_tk0, s_tk0_i


def _mangled(name: str) -> str:
    return f"{len(name)}{name}"


def buffer_id(buf: ir.Buffer) -> str:
    """A buffer's name in GLSL identifiers (b_<id>, B_<id>, quant_<id>, ...)."""
    name = buf.name
    if _BUFFER_SUFFIX.search(name) or (buf.dtype.is_quantized and name in _WEIGHT_WORDS):
        return _mangled(name)
    return name


def shared_id(name: str) -> str:
    """A shared array's name in GLSL identifiers (s_<id>, sq_<id>, s_<id>_q, ...).  An array
    fusec adds (`#tk0`, `#reduce_i`) is printed without its '#'; a stage of that name is
    mangled."""
    if name.startswith("#"):
        return name[1:]
    if _SHARED_SUFFIX.search(name) or name in _SHARED_WORDS or _SHARED_ADDED.match(name):
        return _mangled(name)
    return name


def storage_id(x: ir.Buffer | kir.SharedArray) -> str:
    """`buffer_id` or `shared_id`, as `x` is."""
    return shared_id(x.name) if isinstance(x, kir.SharedArray) else buffer_id(x)


def user_index_vars(region: ir.Region) -> set[ir.IndexVar]:
    """The index variables a region's text declares (lowering adds flattened ones)."""
    out: set[ir.IndexVar] = set()
    if region.per is not None:
        out.add(region.per)
    if region.tile is not None:
        out.update((region.tile.per, *region.tile.dims))
    for stage in region.all_stages():
        out.update(stage.indices)
        out.update(x.var for x in ir.walk(stage.value) if isinstance(x, ir.Reduce))
    return out


def pr_with(pr: _Printer, r: ir.Reduce, name: str) -> _Printer:
    """`pr` printing the argmax `r` as the index local `name`_i."""
    return _Printer(pr.env, {**pr.reduce_names, id(r): f"{name}_i"})


def combine(op: str, acc: str, value: str) -> str:
    return f"{acc} + {value}" if op == "sum" else f"{op}({acc}, {value})"


def float_literal(v: float) -> str:
    text = repr(float(v))
    if text in ("inf", "-inf", "nan"):
        return {
            "inf": "uintBitsToFloat(0x7f800000u)",
            "-inf": "uintBitsToFloat(0xff800000u)",
            "nan": "uintBitsToFloat(0x7fc00000u)",
        }[text]
    return text


def double_literal(v: float) -> str:
    """A GLSL double literal (an f64 stage's constants are finite: they come from the source)."""
    text = repr(float(v))
    assert text not in ("inf", "-inf", "nan"), text
    return text + "lf"


# The kernel being emitted as an item of a persistent product (plan.ItemPlan, persistent.py):
# its workgroup's index and the number of its workgroups are the item function's arguments
# (`item_wg`, `item_count`), not the dispatch's builtins.  Set by emit_kernel from the plan.
_ITEM: contextvars.ContextVar[bool] = contextvars.ContextVar("fusec_item", default=False)


def workgroup_id() -> str:
    """This workgroup's index among the kernel's workgroups."""
    return "item_wg" if _ITEM.get() else "gl_WorkGroupID.x"


def workgroup_count() -> str:
    """How many workgroups the kernel runs on."""
    return "item_count" if _ITEM.get() else "gl_NumWorkGroups.x"


def global_invocation(workgroup_size: int) -> str:
    """This lane's index in the kernel's grid (`workgroup_size` lanes a workgroup)."""
    if _ITEM.get():
        return f"(item_wg * {workgroup_size}u + gl_LocalInvocationIndex)"
    return "gl_GlobalInvocationID.x"


_CONSTS_END = "// (derived constants)"  # where emit_kernel declares them
# Spec ids of derived constants start here (a region's own constants take 0 .. n-1).
DERIVED_SPEC_BASE = 1000


@attrs.define
class _Derived:
    """Integer expressions of constants alone that divide (`(C + NS - 1) / NS`, `h / (NQ /
    NK)`'s `NQ / NK`), each a specialization constant of its own: the runtime computes its
    value (manifest `derived`), and the driver sees a plain constant instead of a
    specialization-constant expression it may or may not fold.  On the H200 this changed no
    timing we measured (attention_split: 13.5 us either way); the decode layer's figures in
    docs/BENCHMARKS.md are with it."""

    names: dict[str, str] = attrs.Factory(dict)  # printed expression -> d_<i>
    exprs: list[ir.Expr] = attrs.Factory(list)

    def name(self, text: str, e: ir.Expr) -> str:
        if text not in self.names:
            self.names[text] = f"d_{len(self.exprs)}"
            self.exprs.append(e)
        return self.names[text]


# the derived constants of the kernel being emitted (None outside emit_kernel)
_DERIVED: contextvars.ContextVar[_Derived | None] = contextvars.ContextVar(
    "fusec_derived", default=None
)


def derivable(e: kir.KExpr) -> bool:
    """An integer expression of (compile-time) constants and literals with a division or a
    remainder in it."""
    nodes = kir.kwalk(e)
    return (
        all(
            isinstance(x, ir.Lit | ir.BinOp) or (isinstance(x, ir.ConstRef) and not x.const.runtime)
            for x in nodes
        )
        and all(x.dtype.is_int for x in nodes if isinstance(x, ir.BinOp))
        and any(isinstance(x, ir.ConstRef) for x in nodes)
        and any(isinstance(x, ir.BinOp) and x.op in ("/", "%") for x in nodes)
    )


def spec_constant_only(e: kir.KExpr) -> bool:
    """An expression of literals and specialization constants alone (with at least one of
    those): GLSL folds it into a specialization-constant expression."""
    nodes = kir.kwalk(e)
    return all(
        isinstance(x, ir.Lit | ir.BinOp | ir.Neg | ir.Call)
        or (isinstance(x, ir.ConstRef) and not x.const.runtime)
        for x in nodes
    ) and any(isinstance(x, ir.ConstRef) for x in nodes)


@attrs.define
class _Printer:
    """Prints expressions; `env` maps index variables to GLSL uint expressions."""

    env: dict[ir.IndexVar, str]
    reduce_names: dict[int, str] = attrs.Factory(dict)  # id(Reduce node) -> local holding it
    overrides: dict[int, str] = attrs.Factory(dict)  # id(Load node) -> an already loaded value
    tile: ir.Tile | None = None
    slot_values: dict[str, int] = attrs.Factory(dict)  # slot index name -> its value here

    def expr(self, e: kir.KExpr) -> str:
        """Print `e` in its own dtype (uint for integers, float otherwise)."""
        if id(e) in self.overrides:
            return self.overrides[id(e)]
        match e:
            case ir.Lit(v, DType.F64):
                return double_literal(float(v))
            case ir.Lit(v, dtype):
                return f"{int(v)}u" if dtype.is_int else float_literal(float(v))
            case ir.ConstRef(c):
                return f"c_{c.name}"
            case ir.IndexRef(var):
                return self.env[var]
            case ir.Load(buf, idx) if buf.dtype == DType.Q8_0X:
                return f"aq_{buffer_id(buf)}({self.flat(buf.shape, idx)})"
            case ir.Load(buf, idx) if buf.dtype.is_quantized:
                flat = self.flat(buf.shape, idx)
                n = buffer_id(buf)
                if buf.dtype == DType.Q4_K:
                    return f"(quant_{n}({flat}) * scale_{n}({flat}) - min_{n}({flat}))"
                return f"(quant_{n}({flat}) * scale_{n}({flat}))"
            case ir.Load(buf, idx):
                text = f"b_{buffer_id(buf)}[{self.flat(buf.shape, idx)}]"
                if buf.dtype == DType.F16:
                    return f"float({text})"
                if buf.dtype == DType.I32:
                    return f"uint({text})"
                return text
            case kir.SharedLoad(arr, idx) if arr.stored is not None:
                return f"sq_{shared_id(arr.name)}({self.expr(idx)})"
            case kir.SharedLoad(arr, idx):
                return f"s_{shared_id(arr.name)}[{self.expr(idx)}]"
            case kir.LocalRef(name):
                return f"v_{name}"
            case kir.WorkgroupIndex():
                return workgroup_id()
            case kir.SliceBase(rows):
                return f"({workgroup_id()} * gl_NumSubgroups * {rows}u)"
            case kir.TileRef(var, _):
                return f"v_{var}[{self.slot_of(e)}]"
            case ir.Call(fn, args, DType.F64):
                form = _F64_FN[fn]
                if form.startswith("fn_"):
                    self.call(form[3 : form.index("(")])
                return form.format(*(self.as_double(a) for a in args))
            case ir.Call(fn, (arg,), _) if fn in ("sin", "cos") and arg.dtype == DType.F64:
                self.call("angle64")
                return f"{fn}(fn_angle64({self.expr(arg)}))"
            case ir.Call(fn, args, _):
                if fn in _FUNCTION_TEXT:
                    self.call(fn)
                return _UNARY_FN[fn].format(*(self.as_float(a) for a in args))
            case ir.BinOp(op, lhs, rhs, DType.F64):
                a, b = self.as_double(lhs), self.as_double(rhs)
                if op in ("<", "<=", ">", ">=", "==", "!="):
                    return f"((({a}) {op} ({b})) ? 1.0lf : 0.0lf)"
                return f"({a} {op} {b})"
            case ir.BinOp(op, lhs, rhs, dtype):
                if op in ("<", "<=", ">", ">=", "==", "!="):
                    both_int = lhs.dtype.is_int and rhs.dtype.is_int
                    a = self.expr(lhs) if both_int else self.as_float(lhs)
                    b = self.expr(rhs) if both_int else self.as_float(rhs)
                    return f"((({a}) {op} ({b})) ? 1.0 : 0.0)"
                if dtype.is_int:
                    text = f"({self.expr(lhs)} {op} {self.expr(rhs)})"
                    derived = _DERIVED.get()
                    if derived is not None and derivable(e):
                        return derived.name(text, e)
                    return text
                return f"({self.as_float(lhs)} {op} {self.as_float(rhs)})"
            case ir.Neg(v):
                return f"(-{self.expr(v)})"
            case ir.Reduce():
                return self.reduce_names[id(e)]
        raise AssertionError(e)

    def slot_of(self, ref: kir.TileRef) -> int:
        """The slot holding a tile value at `ref`'s coordinates (0 without slot indices)."""
        tile = self.tile
        if tile is None or not tile.slot_strides:
            return 0
        slot = 0
        for dim, stride in zip(tile.dims, tile.slot_strides, strict=True):
            if stride:
                slot += self.slot_values[dim.name] * stride
        return slot

    def call(self, fn: str) -> None:
        """Note that the kernel calls the generator-written function `fn` (and those it calls)."""
        called = _CALLED.get()
        if called is not None:
            called.update((fn, *_FUNCTION_NEEDS.get(fn, ())))

    def as_double(self, e: kir.KExpr) -> str:
        """`e` as a GLSL double (exact for integers, f32 and f16 values)."""
        text = self.expr(e)
        if e.dtype == DType.F64:
            return text
        if isinstance(e, ir.Lit):
            return double_literal(float(e.value))
        if e.dtype == DType.I32:
            return f"double(int({text}))"
        return f"double({text})"

    def as_float(self, e: kir.KExpr) -> str:
        text = self.expr(e)
        if e.dtype == DType.F64:
            return f"float({text})"
        if e.dtype.is_int:
            if isinstance(e, ir.Lit):
                return float_literal(float(e.value))
            if e.dtype == DType.I32:  # an i32 element, read as uint: int() gives back its sign
                return f"float(int({text}))"
            return f"float({text})"
        return text

    def flat(self, shape: tuple[ir.Expr, ...], idx: tuple[kir.KExpr, ...]) -> str:
        """Row-major flat index."""
        text = self.expr(idx[0])
        for dim, i in zip(shape[1:], idx[1:], strict=True):
            text = f"({text} * {self.expr(dim)} + {self.expr(i)})"
        return text
