"""Front-end fuzzing in CI (issue 13, part 5): a few hundred seeded sources, generated from
dsl/fuse.lark or mutated from kernels.fuse and the test sources, each run in a worker process
with a 30 s timeout.  Every one must build or give diagnostics at FILE:LINE:COL (or `fusec:
error:`), never an internal error, a hang, a crash, or a file outside its output folder.
A few dozen of those that build also go through `fusec check` (tests/fuzz/frontend.py
`check_build`): each must be verified, refused in one sentence, or explained (a reference that
is not finite, or inputs on which the computation is ill-conditioned), never a mismatch.

The long run is bench/fuzz_frontend.py (docs/FUZZING.md).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.conftest import has_compiler
from tests.fuzz.frontend import (
    Job,
    Pool,
    classify,
    explain_mismatch,
    fuse_sources,
    generated_case,
    mutated_case,
    mutated_sources,
    outcome,
)

SEEDED = settings(
    derandomize=True,
    deadline=None,
    database=None,  # nothing written into the checkout
    # no shrinking: a failure prints its source as found (bench/fuzz_frontend.py shrinks), and
    # the run time stays bounded while known defects are open
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def pool() -> Iterator[Pool]:
    with Pool(workers=1, timeout_s=30.0) as p:
        yield p


def _run(pool: Pool, text: str, sample: int) -> None:
    """One case: every 6th compiles with shaderc (where there is one), every 3rd also writes its
    build folder."""
    job = Job(0, text, compile=sample % 6 == 0 and has_compiler(), write=sample % 3 == 0)
    o = pool.run(job)
    assert o.kind in ("ok", "diagnostic"), (
        f"{o.kind}: {o.signature}\n{o.detail}\n--- source:\n{text}"
    )


@pytest.mark.slow
@settings(SEEDED, max_examples=180)
@given(source=fuse_sources(), sample=st.integers(0, 5))
def test_generated_sources_build_or_give_diagnostics(pool: Pool, source: str, sample: int) -> None:
    _run(pool, source, sample)


@pytest.mark.slow
@settings(SEEDED, max_examples=70)
@given(source=mutated_sources("structure"), sample=st.integers(0, 5))
def test_line_edits_build_or_give_diagnostics(pool: Pool, source: str, sample: int) -> None:
    _run(pool, source, sample)


@pytest.mark.slow
@settings(SEEDED, max_examples=70)
@given(source=mutated_sources("tokens"), sample=st.integers(0, 5))
def test_token_edits_build_or_give_diagnostics(pool: Pool, source: str, sample: int) -> None:
    _run(pool, source, sample)


@pytest.mark.slow
@settings(SEEDED, max_examples=50)
@given(source=mutated_sources("names"), sample=st.integers(0, 5))
def test_renamed_identifiers_build_or_give_diagnostics(
    pool: Pool, source: str, sample: int
) -> None:
    _run(pool, source, sample)


@pytest.mark.slow
@settings(SEEDED, max_examples=50)
@given(source=mutated_sources("numbers"), sample=st.integers(0, 5))
def test_extreme_numbers_build_or_give_diagnostics(pool: Pool, source: str, sample: int) -> None:
    _run(pool, source, sample)


@pytest.mark.slow
@settings(SEEDED, max_examples=25)
@given(source=mutated_sources("depth"), sample=st.integers(0, 5))
def test_deep_expressions_build_or_give_diagnostics(pool: Pool, source: str, sample: int) -> None:
    _run(pool, source, sample)


@pytest.mark.slow
def test_generator_reaches_the_checker_and_codegen(pool: Pool) -> None:
    """The generator stays useful as the grammar changes: most sources parse, and a fair share
    check and build (bench/fuzz_frontend.py prints the same shares)."""
    cases = [Job(i, generated_case(0, i)[1]) for i in range(120)]
    reached = collections.Counter(o.reached for _, o in pool.map(cases))
    parsed = sum(n for stage, n in reached.items() if stage != "none")
    built = reached["build"]
    assert parsed >= 0.7 * len(cases), reached
    assert built >= 0.25 * len(cases), reached


def test_outcome_kinds() -> None:
    good = "region r(x: f32[N]) -> y: f32[N]\n    const N = 64\n    launch workgroup 64\n"
    assert outcome(good + "    y[i] = x[i] * 2.0\n", compile=False) == ("ok", "2 kernel(s)")
    kind, detail = outcome(good + "    y[i] = x[i] *\n", "a.fuse", compile=False)
    assert kind == "diagnostic" and detail.startswith("a.fuse:4:18: error: "), detail
    kind, detail = outcome("", "a.fuse", compile=False)
    assert kind == "diagnostic" and detail.startswith("fusec: error: "), detail
    o = classify(good + "    y[i] = x[i]\n", compile=False)
    assert (o.kind, o.reached) == ("ok", "build")


@pytest.mark.slow
@pytest.mark.shaderc
@pytest.mark.vulkan
def test_built_sources_pass_fusec_check() -> None:
    """The seeded cases 0..109 of bench/fuzz_frontend.py's seed 0, every one compiled and, if it
    builds, checked on the default Vulkan device (30 checks; cases 110..139 added about five
    more, among them case 121's five instances of a 4096 x 4096 projection: 17-30 s on
    lavapipe).  A hang here is 90 s."""
    jobs = [
        Job(i, (generated_case if i % 2 == 0 else mutated_case)(0, i)[1], True, check_seed=i)
        for i in range(110)
    ]
    checks: collections.Counter[str] = collections.Counter()
    refusals: list[str] = []
    with Pool(workers=1, timeout_s=90.0) as pool:
        outcomes = list(pool.map(jobs))
    for job, o in outcomes:
        assert o.kind in ("ok", "diagnostic"), (
            f"case {job.key}: {o.kind}: {o.signature}\n{o.detail}\n--- source:\n{job.text}"
        )
        checks[o.check or "not checked"] += 1
        if o.check == "refused":
            refusals.append(f"case {job.key}: {o.detail}")
    checked = sum(n for k, n in checks.items() if k != "not checked")
    assert checked >= 26, checks
    assert checks["verified"] >= 0.7 * checked, (checks, refusals[:5])


_CHECKED = "region r(x: f32[N]) -> y: f32{shape}\n    const N = 4\n    launch workgroup 64\n"


def _explain(body: str, x: list[float], got: list[float], shape: str = "[N]") -> str:
    import numpy as np

    from fusec.codegen.build import check_source

    region = check_source(_CHECKED.format(shape=shape) + body, "t.fuse").regions[0]
    inputs = {"x": np.array(x, np.float32)}
    values = {"N": 4}
    out = np.array(got, np.float32)
    return explain_mismatch(region, inputs, values, "y", 1e-4, {"fused": out, "unfused": out})[0]


def test_explain_mismatch() -> None:
    """A wrong value is a mismatch; a reference that is not finite where the products agree
    elsewhere, or a sum that cancels in float32, is explained, not loosened."""
    assert _explain("    y[i] = x[i] + 1.0\n", [1, 2, 3, 4], [2, 3, 4, 5]) == "mismatch"
    assert _explain("    y[i] = x[i] + 1.0\n", [1, 2, 3, 4], [2, 3, 4, 5.01]) == "mismatch"
    nan = float("nan")
    log = "    y[i] = log(x[i])\n"
    assert _explain(log, [1, -1, 1, 1], [0, nan, 0, 0]) == "nonfinite"
    assert _explain(log, [1, -1, 1, 1], [0, 5, 0, 0]) == "nonfinite"  # GLSL: undefined
    assert _explain(log, [1, -1, 1, 1], [0, nan, 0, 1]) == "mismatch"
    # 1e8 + 1 - 1e8 is 0 in float32 and 1 in float64: no f32 kernel can be within 1e-4
    total = "    y = sum(k: x[k])\n"
    assert _explain(total, [1e8, 1, -1e8, 0], [0], shape="") == "ill-conditioned"
    assert _explain(total, [1, 2, 3, 4], [10.01], shape="") == "mismatch"
