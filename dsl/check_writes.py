"""Writes where they belong: an output stage whose left side computes its indices
(`kc[h - NQ, pos, d] = ...`) or that writes under a mask (`... where h >= NQ`), and the
coverage of outputs that several such stages share.

Input: a stage's syntax (`check_write_stage`), or the checked stages of a region
(`check_coverage`).  Output: an `ir.Stage` with `out_index` and `mask`, or diagnostics.

At each setting of the constants that dsl/bounds.py tries, the stage's index combinations that
the mask admits are enumerated (`bounds.enumerate_writes`): every index they reach must lie
inside its dimension, and over all stages writing an output, every element is written exactly
once (at most once for a `state` output, which is written in part).  Not checked: settings at
which a stage has more than `bounds.MAX_WRITES` index combinations or an output more elements
(the defaults and low ends of kernels.fuse stay far below), and the values buffers hold.
"""

from __future__ import annotations

import math

import numpy as np

from . import bounds, ir
from . import syntax as S
from .check_exprs import type_expression
from .check_extents import infer_extents
from .check_names import resolve_shape
from .check_state import CheckState, IndexInfo, Names, shadows_declaration, walk_syntax
from .types import DType, Placement, Scope

# what a mask may hold besides index variables, constants and literals
_MASK_FUNCTIONS = ("select", "float")


def writes_part(st: S.Stage) -> bool:
    """A stage of the form this module checks: a mask, or an index that is not a bare name."""
    return st.mask is not None or any(not isinstance(ix, S.Name) for ix in st.indices)


def _text(e: S.Expr) -> str:
    return " ".join(e.span.source.text[e.span.start : e.span.end].split())


def check_write_stage(
    state: CheckState, st: S.Stage, sc: Names, out_buf: ir.Buffer | None
) -> ir.Stage | None:
    """A stage that writes part of an output: its index variables (the names on its left side
    that are no constant), their extents, the computed indices, the mask and an elementwise
    value; None when it is wrong."""
    first = next((ix for ix in st.indices if not isinstance(ix, S.Name)), st.mask)
    assert first is not None
    if out_buf is None:
        state.err(
            first.span,
            f"'{st.name}' is not an output; only an output is written at computed indices "
            "or under a mask",
            f"compute '{st.name}' whole ({st.name}[i] = ...) and read the part you need, "
            f"e.g. {st.name}[i] = x[i + M]",
        )
        return None
    if len(out_buf.shape) != len(st.indices):
        state.err(
            st.name_span,
            f"output '{st.name}' has {len(out_buf.shape)} "
            f"dimension(s) but the stage writes {len(st.indices)}",
            f"write one index per dimension of '{st.name}', {len(out_buf.shape)} in all",
        )
        return None
    if st.layout:
        state.err(
            st.layout[0].span,
            "a stage that writes at computed indices or under a mask must be elementwise, "
            "not a contraction with a layout",
            "compute the contraction into a shared stage first, then write that",
        )
        return None
    # the index variables: names on the left that are no constant or param
    infos: dict[str, IndexInfo] = {}
    for ix in st.indices:
        for x in walk_syntax(ix):
            if isinstance(x, S.Access | S.Call | S.Reduce) or (
                isinstance(x, S.Name) and (x.id in sc.buffers or x.id in sc.stages)
            ):
                name = x.id if isinstance(x, S.Name) else _text(x)
                state.err(
                    x.span,
                    f"index '{_text(ix)}' of '{st.name}' must be integer arithmetic of index "
                    f"names, constants and params, not read '{name}'",
                    "a write lands where its indices say; a value read from memory cannot "
                    "say it (no scattered writes)",
                )
                return None
            if isinstance(x, S.Name) and x.id not in sc.consts and x.id not in infos:
                if shadows_declaration(state, sc, x.id, x.span):
                    return None
                infos[x.id] = IndexInfo(x.id, x.span)
    for ix in st.indices:
        if isinstance(ix, S.Name) and ix.id in st.extents:
            infos[ix.id].extent = resolve_shape(state, st.extents[ix.id], sc)
            infos[ix.id].extent_origin = ix.span
            infos[ix.id].explicit = True
    per = state.per
    if per is not None:
        if per.name not in infos:
            state.err(
                st.indices[0].span if st.indices else st.name_span,
                f"output '{st.name}' of a per-workgroup region must be written at indices "
                f"computed from '{per.name}'",
                f"each workgroup stores its own part: write e.g. {st.name}[{per.name}, ...] "
                f"or {st.name}[{per.name} - N, ...]",
            )
            return None
        infos[per.name].extent = per.extent
    infer_extents(state, st.value, sc, infos, set(infos))
    # a name the mask bounds, `where hq < G` (a conjunct of it), ranges below that bound
    bounded = 0
    for name, bound in _mask_bounds(st.mask):
        info = infos.get(name)
        if (
            info is not None
            and info.extent is None
            and not any(isinstance(x, S.Name) and x.id in infos for x in walk_syntax(bound))
        ):
            info.extent = resolve_shape(state, bound, sc)
            info.extent_origin = bound.span
            bounded += 1
    # a mask that only gave extents holds everywhere: no masked store
    only_extents = st.mask is not None and bounded == len(_conjuncts(st.mask))
    # a bare index name that nothing on the right bounds ranges over its dimension
    for i, ix in enumerate(st.indices):
        if isinstance(ix, S.Name) and ix.id in infos and infos[ix.id].extent is None:
            infos[ix.id].extent = out_buf.shape[i]
            infos[ix.id].extent_origin = out_buf.span
    env: dict[str, ir.IndexVar] = {}
    for name, info in infos.items():
        if per is not None and name == per.name:
            env[name] = per
            continue
        if info.extent is None:
            state.err(
                info.span,
                f"cannot infer the extent of index '{name}'",
                f"use '{name}' directly as an index on the right side, or bound it in the "
                f"mask: ... where {name} < N",
            )
            return None
        env[name] = ir.IndexVar(name, info.extent, span=info.span)
    n_before = len(state.diags)
    out_index = []
    for ix in st.indices:
        state.in_write_index = True
        try:
            typed = type_expression(state, ix, sc, env, reduce_ok=False, row_vars=())
        finally:
            state.in_write_index = False
        if typed.dtype == DType.ERROR:
            return None
        if not typed.dtype.is_int or not bounds.is_arithmetic(typed):
            state.err(
                ix.span,
                f"index '{_text(ix)}' of '{st.name}' must be an integer, not {typed.dtype.value}",
                "index with integer constants and params, + - * / % and index names",
            )
            return None
        out_index.append(typed)
    mask: ir.Expr | None = None
    if st.mask is not None and not only_extents:
        mask = type_expression(state, st.mask, sc, env, reduce_ok=False, row_vars=())
        if mask.dtype == DType.ERROR:
            return None
        odd = [
            x
            for x in ir.walk(mask)
            if not isinstance(x, ir.Lit | ir.ConstRef | ir.IndexRef | ir.BinOp | ir.Neg)
            and not (isinstance(x, ir.Call) and x.fn in _MASK_FUNCTIONS)
        ]
        if odd:
            state.err(
                odd[0].span or st.mask.span,
                "a write mask must be a condition on the stage's indices, constants and "
                f"params, not read '{ir.format_expr(odd[0])}'",
                "compare indices with constants and params, joined with && and ||: "
                f"where {next(iter(env), 'h')} >= N",
            )
            return None
    variables = list(env.values())
    if per is not None:
        variables.sort(key=lambda v: v is not per)  # the workgroup's own index first
    value = type_expression(
        state,
        st.value,
        sc,
        env,
        reduce_ok=True,
        row_vars=tuple(v for v in variables if v is not per),
    )
    if len(state.diags) > n_before or value.dtype == DType.ERROR:
        return None
    if value.dtype.is_int:
        state.err(
            st.value.span,
            f"dtype mismatch: output '{st.name}' is "
            f"{out_buf.dtype.value} but the value is {value.dtype.value}",
            "convert with an arithmetic float expression, e.g. multiply by 1.0",
        )
        return None
    if any(r.scope != Scope.LANE for r in _reductions(value)):
        state.err(
            st.value.span,
            "a stage that writes at computed indices or under a mask must be elementwise, "
            "not a reduction over lanes",
            "compute the reduction into a shared stage first, then write that",
        )
        return None
    stage = ir.Stage(
        st.name,
        tuple(variables),
        value,
        value.dtype,
        Placement.GLOBAL,
        None,
        out_buf,
        span=st.span,
        var=st.name,
        out_index=tuple(out_index),
        mask=mask,
    )
    if not _check_in_bounds(state, st, stage):
        return None
    return stage


def _conjuncts(mask: S.Expr) -> list[S.Expr]:
    if isinstance(mask, S.BinOp) and mask.op == "&&":
        return _conjuncts(mask.lhs) + _conjuncts(mask.rhs)
    return [mask]


def _mask_bounds(mask: S.Expr | None) -> list[tuple[str, S.Expr]]:
    """`(name, E)` for each conjunct `name < E` of a mask."""
    match mask:
        case S.BinOp("&&", lhs, rhs):
            return _mask_bounds(lhs) + _mask_bounds(rhs)
        case S.BinOp("<", S.Name(name), bound):
            return [(name, bound)]
    return []


def _reductions(e: ir.Expr) -> list[ir.Reduce]:
    """The reductions of `e` and of the indexed register stages it reads (lowering inlines
    them where they are read)."""
    out: list[ir.Reduce] = []
    for x in ir.walk(e):
        if isinstance(x, ir.Reduce):
            out.append(x)
        elif (
            isinstance(x, ir.StageRef)
            and x.stage.placement == Placement.REGISTER
            and not x.stage.is_scalar
        ):
            out += _reductions(x.stage.value)
    return out


def _values(state: CheckState, stage: ir.Stage, setting: bounds.Setting) -> dict[str, int | float]:
    consts: dict[str, int | float] = {}
    for x in [*_mask_list(stage), *(stage.out_index or ())]:
        for y in ir.walk(x):
            if isinstance(y, ir.ConstRef):
                consts[y.const.name] = y.const.default
    return {**consts, **setting.values}


def _describe_at(
    w: bounds.Writes, k: int, setting: bounds.Setting, state: CheckState, exprs: list[ir.Expr]
) -> str:
    """` (at h = 0, d = 0)` with the constants' setting where it is not the default."""
    from .check_indices import _where

    at = tuple((v.name, int(w.at[k, i])) for i, v in enumerate(w.variables))
    return _where(bounds.Witness(0, 0, at, setting), *exprs)


def _check_in_bounds(state: CheckState, st: S.Stage, stage: ir.Stage) -> bool:
    """Every index the mask admits lies inside its dimension, at every setting."""
    assert stage.output is not None and stage.out_index is not None
    for setting in state.settings:
        values = _values(state, stage, setting)
        w = bounds.enumerate_writes(stage.indices, stage.out_index, stage.mask, values)
        if w is None:
            continue
        for pos, (ix, index, dim) in enumerate(
            zip(st.indices, stage.out_index, stage.output.shape, strict=True)
        ):
            limit = bounds.evaluate_exact(dim, setting.values, {})
            got = w.coords[pos]
            bad = np.flatnonzero((got < 0) | (got >= limit))
            if not len(bad):
                if not _check_parts(state, st, stage, ix, index, setting, values):
                    return False
                continue
            k = int(bad[0])
            shown = ir.format_expr(dim)
            size = shown if isinstance(dim, ir.Lit) else f"{shown} = {limit}"
            where = _describe_at(w, k, setting, state, [index, dim, *_mask_list(stage)])
            state.err(
                ix.span,
                f"index '{_text(ix)}' of '{st.name}' must stay within 0 .. {limit - 1}, not "
                f"reach {int(got.min())} .. {int(got.max())}"
                + (" where the mask admits" if stage.mask is not None else "")
                + f"; it reaches {int(got[k])}{where}",
                f"dimension {pos} of '{st.name}' has {size} elements: narrow the write with a "
                "mask (where ...) or change the index",
            )
            return False
    return True


def _check_parts(
    state: CheckState,
    st: S.Stage,
    stage: ir.Stage,
    ix: S.Expr,
    index: ir.Expr,
    setting: bounds.Setting,
    values: dict[str, int | float],
) -> bool:
    """Every part of an index stays within 0 .. 2^32 - 1 where the mask admits: the GPU computes
    indices in unsigned 32-bit arithmetic, where `(i - 5) % 3` at i = 0 wraps around to 2, not
    the 1 exact arithmetic (and the reference) gives."""
    parts = [x for x in ir.walk(index) if isinstance(x, ir.BinOp) and x is not index]
    if not parts:
        return True
    w = bounds.enumerate_writes(stage.indices, parts, stage.mask, values)
    if w is None:
        return True
    for part, got in zip(parts, w.coords, strict=True):
        bad = np.flatnonzero((got < 0) | (got >= bounds.U32))
        if not len(bad):
            continue
        k = int(bad[0])
        where = _describe_at(w, k, setting, state, [part, *_mask_list(stage)])
        state.err(
            ix.span,
            f"part '{ir.format_expr(part)}' of index '{_text(ix)}' of '{st.name}' must stay "
            f"within 0 .. 4294967295, not reach {int(got[k])}{where}",
            "indices are unsigned 32-bit: a part below 0 or past 2^32 wraps around before "
            "the rest of the index sees it; reorder the arithmetic (e.g. (i + 3 * M - 5) % M)",
        )
        return False
    return True


def _setting_words(setting: bounds.Setting, stages: list[ir.Stage]) -> str:
    """`, with every constant at the low end of its range: M = 1` (the constants the stages'
    indices and masks use), or nothing at the defaults."""
    if setting.name == "default":
        return ""
    names = sorted(
        {
            y.const.name
            for s in stages
            for x in [*_mask_list(s), *(s.out_index or ()), *(v.extent for v in s.indices)]
            for y in ir.walk(x)
            if isinstance(y, ir.ConstRef) and y.const.name in setting.values
        }
    )
    consts = ", ".join(f"{n} = {setting.values[n]}" for n in names)
    return f", with {bounds.SETTING_WORDS[setting.name]}" + (f": {consts}" if consts else "")


def _mask_list(stage: ir.Stage) -> list[ir.Expr]:
    return [stage.mask] if stage.mask is not None else []


def check_coverage(state: CheckState, outputs: tuple[ir.Buffer, ...], flat: list[ir.Stage]) -> None:
    """Over the stages writing an output, when one writes part of it: every element written
    exactly once, or at most once for a state output."""
    for out in outputs:
        writers = [s for s in flat if s.output is out]
        if not any(s.writes_part for s in writers):
            continue
        for setting in state.settings:
            if not _check_coverage_at(state, out, writers, setting):
                break


def _check_coverage_at(
    state: CheckState, out: ir.Buffer, writers: list[ir.Stage], setting: bounds.Setting
) -> bool:
    dims = [bounds.evaluate_exact(d, setting.values, {}) for d in out.shape]
    if any(d <= 0 for d in dims) or math.prod(dims) > 1 << 62:
        return True  # an empty dimension, diagnosed where it is declared; or past int64
    size = math.prod(dims)
    flats: list[np.ndarray] = []
    owners: list[np.ndarray] = []
    found: list[bounds.Writes] = []
    for n, s in enumerate(writers):
        index = s.out_index or tuple(ir.IndexRef(v) for v in s.indices)
        w = bounds.enumerate_writes(s.indices, index, s.mask, _values(state, s, setting))
        if w is None:
            return True  # too large to enumerate at this setting
        inside = all(((c >= 0) & (c < d)).all() for c, d in zip(w.coords, dims, strict=True))
        if not inside:
            return True  # the stage's own diagnostic says where
        flats.append(np.ravel_multi_index(w.coords, dims) if dims else np.zeros(len(w.at), int))
        owners.append(np.full(len(w.at), n))
        found.append(w)
    flat = np.concatenate(flats) if flats else np.zeros(0, np.int64)
    owner = np.concatenate(owners) if owners else np.zeros(0, np.int64)
    order = np.argsort(flat, kind="stable")
    sorted_flat = flat[order]
    twice = np.flatnonzero(sorted_flat[1:] == sorted_flat[:-1])
    if len(twice):
        a, b = order[twice[0]], order[twice[0] + 1]
        element = np.unravel_index(int(flat[a]), dims)
        shown = f"{out.name}[{', '.join(str(int(i)) for i in element)}]"
        sa, sb = writers[int(owner[a])], writers[int(owner[b])]
        ka = int(a) - sum(len(f) for f in flats[: int(owner[a])])
        kb = int(b) - sum(len(f) for f in flats[: int(owner[b])])
        plain = bounds.Setting("default", setting.values)
        at_a = _describe_at(found[int(owner[a])], ka, plain, state, [])
        at_b = _describe_at(found[int(owner[b])], kb, plain, state, [])
        if sa is sb:
            again = at_b.removeprefix(" (at ").removesuffix(")")
            by = f"twice by this stage{at_a[:-1]}, and again at {again})"
        else:
            by = f"by this stage{at_b} and by the stage on line {sa.span.line_col()[0]}{at_a}"
        state.err(
            sb.span,
            f"element {shown} is written {by}{_setting_words(setting, [sa, sb])}",
            f"every element of '{out.name}' is written once: make the masks of the stages "
            f"writing it disjoint, or their indices one-to-one",
        )
        return False
    if not out.state and len(flat) < size and size <= 4 * bounds.MAX_WRITES:
        missing = np.setdiff1d(np.arange(size, dtype=np.int64), flat, assume_unique=False)
        element = np.unravel_index(int(missing[0]), dims)
        shown = f"{out.name}[{', '.join(str(int(i)) for i in element)}]"
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        state.err(
            out.span,
            f"output '{out.name}' must be written whole, but {shown}{more} is never written"
            + _setting_words(setting, writers),
            f"widen the masks of the stages writing '{out.name}' to cover every element, "
            "or declare it state (written in part, kept between runs)",
        )
        return False
    return True
