"""Weights repacked at upload: the bytes a device buffer of a packed weight holds (dsl/packing.py).

The manifest marks a region's weight input packed (`Buffer.packing`); every upload of it (a
region's run, `fusec bench`'s extra weight copies, a decode step's buffers) goes through
`device_array`, after the input checks have passed on the GGUF bytes.  One buffer per weight:
the fused kernel and the unfused chain of the region read the same packed layout.

Input: a manifest buffer record and the array the caller passed (GGUF block bytes).  Output:
the array to upload.  Not checked here: the array's size and dtype (dispatch.check_inputs)."""

from __future__ import annotations

import numpy as np

from fusec.codegen import manifest_records as mr
from fusec.codegen.manifest_kernel import Packed
from fusec.dsl.packing import PACKING_VERSION, Packing, pack_blocks
from fusec.dsl.types import DType

from .device import RuntimeFailure


def device_array(buf: mr.Buffer, array: np.ndarray) -> np.ndarray:
    """`array` as the device buffer of `buf` holds it: repacked when the manifest says so."""
    return packed_array(buf.dtype, buf.packing, array)


def packed_array(dtype: str, packing: Packed | None, array: np.ndarray) -> np.ndarray:
    """GGUF block bytes `array` of `dtype` in the layout `packing` (itself when None)."""
    if packing is None:
        return array
    if packing.version != PACKING_VERSION:
        raise RuntimeFailure(
            f"the manifest packs weights with layout {packing.layout} version "
            f"{packing.version}, but this fusec writes version {PACKING_VERSION}",
            "rebuild the folder with this fusec",
        )
    return pack_blocks(DType(dtype), Packing(packing.layout), array)
