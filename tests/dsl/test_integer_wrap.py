"""Integer arithmetic read where its value matters (a division, a remainder, a comparison, a
conversion to a real) stays within u32 (dsl/check_indices.py `check_no_wrap`): the GPU computes
it unsigned and the numpy reference in exact integers, so a wrapped value made the two differ
silently (`float(n - 1)` was 4294967295.0 on lavapipe).  The catalogue holds the diagnostics
(tests/dsl/errors/integer_*); here, what stays accepted and what each wrapped form became."""

from __future__ import annotations

import numpy as np
import pytest

from fusec.dsl.check import check
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.parse import parse
from fusec.dsl.reference import run_reference

HEAD = """\
region r(x: f32[K]) -> y: f32[K]
    const K = 37 in 2 .. 4096
    launch workgroup 64
"""


def _check(body: str) -> object:
    return check(parse(HEAD + body, "t.fuse"))


@pytest.mark.parametrize(
    "body",
    [
        "    y[k] = x[(k + K - 1) % K]\n",  # the same shift, no part below 0
        "    y[k] = x[k] * (float(k) - 1.0)\n",
        "    y[k] = select(k < 5, x[k], 0.0)\n",
        "    y[k] = x[K - 1 - k] * float(K - 1 - k)\n",  # below 0 nowhere
        "    y[k] = x[(k - 1 + K) % K]\n",  # wraps and wraps back before the remainder
    ],
)
def test_accepts_arithmetic_that_stays_in_u32(body: str) -> None:
    _check(body)


@pytest.mark.parametrize(
    ("body", "where"),
    [
        ("    y[k] = x[k] * float(k - 1)\n", "before it becomes a real"),
        ("    y[k] = x[k] * (k - 2)\n", "before it becomes a real"),
        ("    y[k] = x[k] * -(k - 1)\n", "before it becomes a real"),
        ("    y[k] = x[(k - 3) / 2]\n", "before the division"),
        ("    y[k] = x[(k - 1) % K]\n", "before the remainder"),
        ("    y[k] = select(k - 1 < 4, x[k], 0.0)\n", "before the comparison"),
        ("    y[k] = x[k] / float(K * K * K)\n", "wraps around to 0 before it becomes a real"),
    ],
)
def test_refuses_arithmetic_that_wraps(body: str, where: str) -> None:
    with pytest.raises(DiagnosticError) as info:
        _check(body)
    (d,) = info.value.diagnostics
    assert d.message.startswith("integer '") and where in (d.hint or "")


def test_the_accepted_shift_rotates_as_numpy_does() -> None:
    prog = check(parse(HEAD + "    y[k] = x[(k + K - 1) % K] * (float(k) - 1.0)\n", "t.fuse"))
    x = np.random.default_rng(7).standard_normal(37).astype(np.float32) + 3.0
    got = run_reference(prog.regions[0], {"x": x}, {"K": 37})["y"]
    want = np.roll(x.astype(np.float64), 1) * (np.arange(37) - 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-6)  # the output is f32


def test_a_run_whose_constants_wrap_an_integer_is_refused() -> None:
    # the three settings the checker tries keep K - M at 0 or above; a run may not
    from fusec.dsl.bounds import overrun_at
    from fusec.dsl.reference import const_values

    text = """\
region r(x: f32[K]) -> y: f32[K]
    const K = 64 in 1 .. 4096, M = 10 in 1 .. 100
    launch workgroup 64
    y[k] = x[k] * float(K - M)
"""
    region = check(parse(text, "t.fuse")).regions[0]
    assert overrun_at(region, const_values(region, {"K": 50, "M": 7})) is None
    problem = overrun_at(region, const_values(region, {"K": 5, "M": 50}))
    assert problem is not None and problem.span is not None
    assert problem.message == (
        "in region 'r' at K=5, M=50, integer 'K - M' reaches -45, outside the unsigned 32-bit "
        "range it is computed in"
    )
    assert text[problem.span.start : problem.span.end] == "K - M"


def _int_input(dtype: str, lo: int, hi: int, body: str) -> str:
    return (
        f"region r(x: {dtype}[N] in {lo} .. {hi}) -> y: f32[N]\n"
        "    const N = 40 in 1 .. 100\n"
        "    launch workgroup 64\n"
        f"    y[n] = {body}\n"
    )


def test_values_read_from_integer_inputs_must_stay_in_u32() -> None:
    """An i32 or u32 input's values in integer arithmetic are unsigned on the GPU and exact in
    the reference: `select(x[n] < 0, ...)` never held on the device and `float(x[n] - 10)`
    was 4.3e9 (found by a new-user probe: both products MISMATCH).  Such arithmetic must stay
    within 0 .. 2^32 - 1 for every value the input's declared range (else its dtype) allows;
    a read converted to a real as it is keeps its sign.  Random ranges and offsets."""
    import random

    rng = random.Random()
    for _ in range(40):
        dtype = rng.choice(["u32", "i32"])
        lo = rng.randint(0 if dtype == "u32" else -50, 50)
        hi = lo + rng.randint(1, 100)
        c = rng.randint(0, 100)
        for body, ok in (
            (f"float(x[n] - {c})", lo - c >= 0),
            (f"select(x[n] + {c} < 60, 1.0, 2.0)", lo + c >= 0),
            (f"float((x[n] + {c}) / 3)", lo + c >= 0),
            ("float(x[n])", True),  # converted as it is: signed where it is i32
        ):
            text = _int_input(dtype, lo, hi, body)
            if ok:
                check(parse(text, "t.fuse"))
                continue
            with pytest.raises(DiagnosticError) as info:
                check(parse(text, "t.fuse"))
            (d,) = info.value.diagnostics
            assert d.message.startswith("integer '"), d.message
            assert f"where 'x' holds {lo} .. {hi}" in d.message, (text, d.message)
            assert "values read from integer inputs too" in (d.hint or "")
    # no declared range: an i32 may be negative, a u32 may be 2^32 - 1
    for dtype, body in (("i32", "float(x[n] / 2)"), ("u32", "float(x[n] + 1)")):
        text = f"region r(x: {dtype}[N]) -> y: f32[N]\n    const N = 4\n    launch workgroup 64\n"
        with pytest.raises(DiagnosticError) as info:
            check(parse(text + f"    y[n] = {body}\n", "t.fuse"))
        assert f"where 'x' may hold any {dtype}" in info.value.diagnostics[0].message
