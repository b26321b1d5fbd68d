"""The parameter buffer's contents: one 32-bit word per run-time parameter, in slot order.

Input: a region's run-time parameters (manifest records, `spec_id` their slot) and their values,
already refused where they do not fit (`runtime.dispatch.const_value`).  Output: the u32 words
the host writes to the buffer the kernels read as `uint[]`: a u32 param's value, or an f32
param's bit pattern (kernels read it back with `uintBitsToFloat`, codegen/glsl.py).
Not done here: range checks and the upload itself (runtime/dispatch.py `set_params`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from fusec.codegen import manifest_records as mr


def param_words(params: Sequence[mr.Const], values: Mapping[str, int | float]) -> np.ndarray:
    """The words of the parameter buffer for `params` (in slot order) at `values`."""
    words = np.zeros(len(params), np.uint32)
    for i, c in enumerate(params):
        if c.dtype == "f32":
            words[i] = np.array([values[c.name]], np.float32).view(np.uint32)[0]
        else:
            words[i] = int(values[c.name])
    return words
