"""u32 and i32 outputs are compared exactly by `fusec check` (runtime/verify.py): one index off
is a mismatch, whatever the normwise error it makes."""

from __future__ import annotations

import math

import numpy as np

from fusec.codegen import manifest_records as mr
from fusec.runtime.verify import OutputReport, output_tolerance, relative_error


def test_integer_outputs_have_no_tolerance() -> None:
    idx = mr.Buffer("idx", "u32", ())
    w = mr.Buffer("w", "f32", (), tolerance=3e-3)
    assert output_tolerance(idx, 1e-4) == 0.0
    assert output_tolerance(mr.Buffer("d", "i32", ()), 2e-3) == 0.0
    assert output_tolerance(w, 1e-4) == 3e-3
    assert output_tolerance(mr.Buffer("y", "f16", ()), 2e-3) == 2e-3


def test_one_index_off_is_a_mismatch() -> None:
    rng = np.random.default_rng()
    ref = rng.integers(1, 1_000_000, 64).astype(np.uint32)
    got = ref.copy()
    got[int(rng.integers(0, 64))] += 1
    err = relative_error(got, ref)
    assert 0 < err < 1e-5  # normwise it would pass an f32 tolerance
    bad = OutputReport("idx", err, 0.0, 0.0)
    assert not bad.ok and math.isinf(bad.used)
    good = OutputReport("idx", relative_error(ref, ref), 0.0, 0.0)
    assert good.ok and good.used == 0.0
    # the poison of an output no kernel wrote (every bit set) is far off too
    assert relative_error(np.full(64, 0xFFFFFFFF, np.uint32), ref) > 1
