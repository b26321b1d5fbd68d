"""Extent inference: the values an index variable ranges over, from the dimensions it subscripts.

Input: a stage's value (syntax) and its index variables.  Output: each variable's extent in its
`IndexInfo`, and a diagnostic where one variable meets dimensions of different extents.  Not
checked here: index arithmetic (`x[i + 1]` does not set the extent of i; check_indices.py).
"""

from __future__ import annotations

from . import ir
from . import syntax as S
from .check_names import resolve_shape
from .check_state import CheckState, IndexInfo, Names, visible_shape
from .types import DType


def infer_extents(
    state: CheckState, e: S.Expr, sc: Names, infos: dict[str, IndexInfo], bound: set[str]
) -> None:
    """Record, for every index variable used directly as a subscript, the dimension it meets."""
    match e:
        case S.Access(name, indices):
            shape: tuple[ir.Expr, ...] | None = None
            if name in sc.buffers:
                shape = sc.buffers[name].shape
            elif name in sc.stages:
                shape = visible_shape(state, sc.stages[name])
            if shape is not None and len(shape) != len(indices):
                shape = None  # the index count is diagnosed when the access is typed
            for pos, ix in enumerate(indices):
                if (
                    isinstance(ix, S.Name)
                    and ix.id in infos
                    and ix.id in bound
                    and shape is not None
                    and pos < len(shape)
                ):
                    info = infos[ix.id]
                    dim = shape[pos]
                    if info.extent is None:
                        info.extent, info.extent_origin = dim, ix.span
                    elif (
                        info.extent != dim
                        and not info.explicit
                        and DType.ERROR not in (info.extent.dtype, dim.dtype)
                    ):
                        was = ir.format_expr(info.extent)
                        line = info.extent_origin.line_col()[0] if info.extent_origin else 0
                        state.err(
                            ix.span,
                            f"shape mismatch: index '{ix.id}' ranges over "
                            f"{was} (line {line}) but dimension {pos} of '{name}' is "
                            f"{ir.format_expr(dim)}",
                            "index each dimension with a variable of the same extent",
                        )
                else:
                    infer_extents(state, ix, sc, infos, bound)
        case S.Reduce(_, index, body):
            if index in bound:
                state.err(
                    e.index_span,
                    f"reduction index '{index}' is already bound by "
                    "the stage or an enclosing reduction",
                    "use a fresh index name",
                )
                return
            # a fresh variable per reduction: two reductions may reuse a name with
            # different extents; outer variables stay shared (same objects)
            infos_inner = {**infos, index: IndexInfo(index, e.index_span)}
            infer_extents(state, body, sc, infos_inner, bound | {index})
        case S.Call(_, args):
            for a in args:
                infer_extents(state, a, sc, infos, bound)
        case S.BinOp(_, lhs, rhs):
            infer_extents(state, lhs, sc, infos, bound)
            infer_extents(state, rhs, sc, infos, bound)
        case S.Neg(v):
            infer_extents(state, v, sc, infos, bound)
        case _:
            pass


def reads_poisoned(e: S.Expr, sc: Names) -> bool:
    """Whether `e` reads a name whose declaration already failed (`Names.poisoned`): an index
    it subscripts then has no extent to infer, which is that failure's consequence, not a
    second mistake to report."""
    match e:
        case S.Name(name):
            return name in sc.poisoned
        case S.Access(name, indices):
            return name in sc.poisoned or any(reads_poisoned(i, sc) for i in indices)
        case S.Call(_, args):
            return any(reads_poisoned(a, sc) for a in args)
        case S.Reduce(_, _, body):
            return reads_poisoned(body, sc)
        case S.BinOp(_, lhs, rhs):
            return reads_poisoned(lhs, sc) or reads_poisoned(rhs, sc)
        case S.Neg(v):
            return reads_poisoned(v, sc)
    return False


def infer_reduce_extent(
    state: CheckState, e: S.Reduce, sc: Names, env: dict[str, ir.IndexVar]
) -> ir.Expr | None:
    """The extent of a reduction's index: as written (`sum(t < M: ...)`), else inferred from
    the dimensions its body subscripts with it."""
    if e.extent is not None:
        if e.extent_op != "<":
            state.err(
                e.index_span,
                f"write the extent of '{e.index}' as '{e.index} < N', "
                f"not '{e.index} {e.extent_op} ...'",
                f"the index runs from 0 below the bound: {e.index} < N",
            )
            return None
        ext = resolve_shape(state, e.extent, sc)
        return None if ext.dtype == DType.ERROR else ext
    infos: dict[str, IndexInfo] = {e.index: IndexInfo(e.index, e.index_span)}
    infer_extents(state, e.body, sc, infos, set(env) | {e.index})
    extent = infos[e.index].extent
    if extent is None and reads_poisoned(e.body, sc):
        return None  # the stage it reads failed, with a diagnostic of its own
    if extent is None:
        state.err(
            e.index_span,
            f"reduction over '{e.index}', an index its body never uses as a subscript",
            f"reduce over an index that subscripts an input, e.g. sum({e.index}: x[{e.index}])",
        )
        return None
    return extent
