"""The manifest: what an engine needs to run prebuilt SPIR-V without the compiler.

Pure data (JSON in, JSON out, no Vulkan and no shaderc), so the runtime can import it.
Shape and grid expressions are stored as small trees over constant names and evaluated here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dsl import ir

FORMAT = "fusec-manifest/1"
JsonExpr = Any  # int | {"const": name} | {"op": "+", "lhs": ..., "rhs": ...}


def expr_to_json(e: ir.Expr) -> JsonExpr:
    match e:
        case ir.Lit(v, _):
            return int(v)
        case ir.ConstRef(c):
            return {"const": c.name}
        case ir.BinOp(op, lhs, rhs, _):
            return {"op": op, "lhs": expr_to_json(lhs), "rhs": expr_to_json(rhs)}
    raise AssertionError(f"not a shape expression: {e}")


def eval_json(e: JsonExpr, consts: Mapping[str, int | float]) -> int:
    if isinstance(e, int):
        return e
    if "const" in e:
        return int(consts[e["const"]])
    a, b = eval_json(e["lhs"], consts), eval_json(e["rhs"], consts)
    op = e["op"]
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a // b
    if op == "%":
        return a % b
    raise ValueError(f"bad manifest expression operator {op!r}")


def eval_u32(e: JsonExpr, consts: Mapping[str, int | float]) -> int:
    """`e` as a shader computes it in uint arithmetic: every step wraps modulo 2^32 (a derived
    constant such as `(C - 1) / NS` then matches the expression it replaces)."""
    if isinstance(e, int):
        return e & 0xFFFFFFFF
    if "const" in e:
        return int(consts[e["const"]]) & 0xFFFFFFFF
    a, b = eval_u32(e["lhs"], consts), eval_u32(e["rhs"], consts)
    op = e["op"]
    if op in ("/", "%") and b == 0:
        raise ValueError(f"{format_json(e)} divides by zero")
    value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b, "%": a % b}[op]
    return value & 0xFFFFFFFF


def format_json(e: JsonExpr) -> str:
    """A manifest expression as text, for messages: `(C + NS - 1) / NS`."""
    if isinstance(e, int):
        return str(e)
    if "const" in e:
        return str(e["const"])
    return f"({format_json(e['lhs'])} {e['op']} {format_json(e['rhs'])})"


def derived_specs(
    kernel: Mapping[str, Any], consts: Mapping[str, int | float]
) -> list[tuple[int, str, int | float]]:
    """The kernel's derived specialization constants at these constants: (spec id, "u32",
    value).  ValueError names the expression that divides by zero."""
    return [(d["spec_id"], "u32", eval_u32(d["expr"], consts)) for d in kernel.get("derived", [])]


def workgroups(
    kernel: Mapping[str, Any],
    consts: Mapping[str, int | float],
    subgroup_size: int,
    max_groups: int = 65535,
) -> int:
    """Workgroups to dispatch: enough for the phase with the most work (phases loop over the
    grid, so fewer would still be correct, only slower)."""
    wg = int(kernel["workgroup_size"])
    groups = 1
    for item in kernel["grid"]:
        extent = eval_json(item["extent"], consts)
        if item["per_workgroup"] is not None:
            per = int(item["per_workgroup"])
        else:
            per = int(item["rows_per_subgroup"]) * max(1, wg // subgroup_size)
        groups = max(groups, math.ceil(extent / per))
    return min(groups, max_groups)


def shared_bytes(kernel: Mapping[str, Any], consts: Mapping[str, int | float]) -> int:
    total = sum(4 * eval_json(e, consts) for e in kernel["shared_floats"])
    if kernel["reduction_scratch"]:
        total += 4 * int(kernel["workgroup_size"])
    if kernel.get("exchange_scratch"):
        total += 4 * int(kernel["workgroup_size"])
    return total


QUANT_BLOCK = 32
QUANT_BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q8_0x": 48}


def storage_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The numpy shape a buffer is stored with: element shape, except GGUF-quantized weights,
    which are uint8 rows of blocks (as gguf.quants.quantize returns them)."""
    if dtype in QUANT_BLOCK_BYTES:
        # a q8_0x intermediate may end in a partial block; weights are whole blocks
        return (*shape[:-1], -(-shape[-1] // QUANT_BLOCK) * QUANT_BLOCK_BYTES[dtype])
    return shape
