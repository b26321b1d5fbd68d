"""A packed weight in the manifest (codegen/manifest_kernel.Packed): the build records it on the
region's input, it round-trips, the schema refuses another layout or version (a folder whose
layout this fusec would read with the wrong offsets), and the consistency check refuses a
packing on anything but a GGUF weight input."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from fusec.codegen import manifest as mf
from fusec.codegen import manifest_records as mr
from fusec.codegen.build import build_source

pytestmark = pytest.mark.shaderc

DATA = Path(__file__).parents[1] / "data" / "repack.fuse"


@pytest.fixture(scope="module")
def data() -> dict[str, Any]:
    result = build_source(DATA.read_text(), str(DATA), regions=("pd_q4_K", "pp"))
    out: dict[str, Any] = json.loads(json.dumps(result.manifest_json))
    return out


def _region(d: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for r in d["regions"] if r["name"] == name)


def _weight(d: dict[str, Any], region: str) -> dict[str, Any]:
    return next(b for b in _region(d, region)["inputs"] if b["name"] == "W")


def test_the_build_records_the_packing(data: dict[str, Any]) -> None:
    assert _weight(data, "pd_q4_K")["packing"] == {"layout": "split", "version": 1}
    assert "packing" not in _weight(data, "pp")
    m = mr.Manifest.from_json(data)
    assert m.to_json() == data
    (w,) = [b for b in m.region("pd_q4_K").inputs if b.name == "W"]
    assert w.packing == mr.Buffer.from_json(_weight(data, "pd_q4_K")).packing
    assert mf.schema_error(data) is None and mf.semantic_error(m) is None


@pytest.mark.parametrize(
    "packing", [{"layout": "interleaved", "version": 1}, {"layout": "split", "version": 2}, {}]
)
def test_the_schema_refuses_other_layouts_and_versions(
    data: dict[str, Any], packing: dict[str, Any]
) -> None:
    d = copy.deepcopy(data)
    _weight(d, "pd_q4_K")["packing"] = packing
    assert mf.schema_error(d) is not None


@pytest.mark.parametrize("buffer", ["x", "y"])
def test_only_a_gguf_weight_input_is_packed(data: dict[str, Any], buffer: str) -> None:
    d = copy.deepcopy(data)
    r = _region(d, "pd_q4_K")
    (b,) = [b for b in [*r["inputs"], *r["outputs"]] if b["name"] == buffer]
    b["packing"] = {"layout": "split", "version": 1}
    assert mf.schema_error(d) is None
    assert mf.semantic_error(mr.Manifest.from_json(d)) == (
        f"buffer '{buffer}' is packed but is not a GGUF weight input"
    )
