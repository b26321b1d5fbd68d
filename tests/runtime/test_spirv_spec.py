"""Specialization constants written into the SPIR-V (runtime/spirv_spec.py,
`FUSEC_SPEC_CONSTANTS`): on every module of kernels.fuse, with values drawn afresh inside each
constant's range, the rewritten module validates and holds exactly the values drawn; a region
run with its constants frozen matches numpy on lavapipe; a bad switch value is refused in one
sentence.  (The tiny decode layer under both modes: tests/runtime/layer_products.py.)"""

from __future__ import annotations

import json
import random
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest

from fusec.runtime import cli, dispatch
from fusec.runtime.device import RuntimeFailure
from fusec.runtime.spirv_spec import MODES, spec_mode, specialize

pytestmark = pytest.mark.shaderc

_DECORATE, _SPEC_ID = 71, 1
_SPEC_OPS = {48, 49, 50}  # OpSpecConstantTrue, False, OpSpecConstant
_CONST = 43


def _insts(spv: bytes) -> list[tuple[int, list[int]]]:
    words = struct.unpack(f"<{len(spv) // 4}I", spv)
    out, i = [], 5
    while i < len(words):
        n = words[i] >> 16
        out.append((words[i] & 0xFFFF, list(words[i + 1 : i + n])))
        i += n
    return out


def _spec_ids(spv: bytes) -> dict[int, int]:
    """result id -> SpecId."""
    return {a[0]: a[2] for op, a in _insts(spv) if op == _DECORATE and a[1] == _SPEC_ID}


def _draw(c: dict[str, Any], rng: random.Random) -> int | float:
    if c["dtype"] == "f32":
        return rng.uniform(1e-7, 1e-2)
    lo, hi = c.get("min") or 1, min(c.get("max") or 1 << 16, 1 << 20)
    return rng.randint(lo, hi)


def _word(dtype: str, v: int | float) -> int:
    if dtype == "f32":
        return int(struct.unpack("<I", struct.pack("<f", float(v)))[0])
    return int(v) & 0xFFFFFFFF


def test_every_module_holds_the_values_drawn(kernels_folder: Path) -> None:
    rng = random.Random()
    seed = rng.randrange(1 << 32)
    rng.seed(seed)
    manifest = json.loads((kernels_folder / "manifest.json").read_text())
    val = shutil.which("spirv-val")
    checked = 0
    for region in manifest["regions"]:
        consts = [c for c in region["consts"] if not c["runtime"]]
        spec = [(c["spec_id"], c["dtype"], _draw(c, rng)) for c in consts]
        want = {cid: _word(dt, v) for cid, dt, v in spec}
        for k in [*region["fused"], *region["unfused"]]:
            spv = (kernels_folder / k["spv"]).read_bytes()
            assert specialize(spv, spec, "pass") == spv
            ids = _spec_ids(spv)
            for mode in ("defaults", "freeze"):
                out = specialize(spv, spec, mode)
                left = _spec_ids(out)
                for op, a in _insts(out):
                    if op in (50, 43) and len(a) == 3 and a[1] in ids and ids[a[1]] in want:
                        assert a[2] == want[ids[a[1]]], (seed, k["name"], mode)
                        # frozen: a plain constant without its SpecId; defaults: still special
                        assert (op == _CONST) == (mode == "freeze"), (seed, k["name"])
                        assert (a[1] in left) == (mode == "defaults"), (seed, k["name"])
                        checked += 1
                if val is not None and rng.random() < 0.1:  # spirv-val on a tenth of them
                    proc = subprocess.run(
                        [val, "--target-env", "vulkan1.2", "-"], input=out, capture_output=True
                    )
                    assert proc.returncode == 0, (seed, k["name"], mode, proc.stderr[:300])
    assert checked > 1000, checked  # every specialized constant of every module was seen


@pytest.mark.vulkan
def test_a_region_with_its_constants_frozen_matches_numpy(
    kernels_folder: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random()
    k, n = 32 * rng.randint(3, 40), rng.randint(17, 300)
    made: list[bytes] = []  # the modules the runtime created its pipelines from

    class Spy(dispatch.Pipeline):
        def __init__(self, dev: Any, spv: bytes, *args: Any, **kwargs: Any) -> None:
            made.append(spv)
            super().__init__(dev, spv, *args, **kwargs)

    monkeypatch.setattr(dispatch, "Pipeline", Spy)
    region = "rms_norm_mul_matvec<q4_0>"
    for mode in ("freeze", "defaults"):
        monkeypatch.setenv("FUSEC_SPEC_CONSTANTS", mode)
        made.clear()
        argv = ["check", str(kernels_folder), "--region", region, "--const", f"K={k}"]
        assert cli.main([*argv, "--const", f"N={n}"]) == 0
        out = capsys.readouterr().out
        assert f"specialization constants: {mode} (FUSEC_SPEC_CONSTANTS)" in out
        assert f"K={k}, N={n}" in out and ": fused;" in out, out
        # K (spec id 0) and N (1) were written into every module: gone as parameters when
        # frozen, still parameters (with these defaults) otherwise
        assert made
        for spv in made:
            left = set(_spec_ids(spv).values())
            assert ({0, 1} & left == set()) == (mode == "freeze"), (mode, left)


def test_a_bad_switch_is_refused_in_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("Freeze", "on", "1", "pass ", ""):
        monkeypatch.setenv("FUSEC_SPEC_CONSTANTS", value)
        with pytest.raises(RuntimeFailure) as info:
            spec_mode()
        [d] = info.value.diagnostics
        assert d.message == f"FUSEC_SPEC_CONSTANTS={value!r} is not a way of passing " + (
            "specialization constants"
        )
        assert d.hint == "use one of: " + ", ".join(MODES)
    monkeypatch.delenv("FUSEC_SPEC_CONSTANTS")
    assert spec_mode() == "pass"
