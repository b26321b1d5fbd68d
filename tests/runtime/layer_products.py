"""Every product of the tiny decode layer against the numpy layer, at the subgroup size the
environment gives lavapipe (child process of tests/runtime/test_layer_products.py: lavapipe's
LP_NATIVE_VECTOR_WIDTH applies to a process's device alone).

`python tests/runtime/layer_products.py BUILD_DIR`: for each product (the attention products,
the QKV epilogue, the grouped-query split, the q8_0x chain, the unfused chain, every weight
type, constants written into the SPIR-V), two tokens at advancing pos, one recording replayed;
prints one JSON line per product with the subgroup size, the regions and paths that ran, and
each token's errors.  Exit 1 when a product does not match within the layer's tolerance or a
product other than the unfused chain ran a region unfused.  (The persistent product has its
own runs: persistent_runs.py.)
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

from examples.decode_layer.run import TOLERANCE, decode
from fusec.runtime import decode_layer as layer
from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build

# name -> (weights, attention, module switches set for the product, fused)
PRODUCTS: dict[str, tuple[str, str | None, dict[str, bool], bool]] = {
    "f16 rope (default)": ("f16", None, {}, True),
    "f16 split": ("f16", "split", {}, True),
    "f16 fused attention": ("f16", "fused", {}, True),
    "f16 QKV epilogue": ("f16", "split", {"QKV_EPILOGUE": True}, True),
    "f16 grouped-query split": ("f16", "split", {"GQA_SPLIT": True}, True),
    "f16 unfused": ("f16", None, {}, False),
    "q8_0": ("q8_0", None, {}, True),
    "q4_0": ("q4_0", None, {}, True),
    "q4_0 q8_0x inputs": ("q4_0", None, {"Q8_INPUTS": True}, True),
    "q4_K": ("q4_K", None, {}, True),
    "q4_k_m": ("q4_k_m", None, {}, True),
    "f16, constants frozen into the SPIR-V": ("f16", None, {}, True),
    "q4_0, constants as the SPIR-V's defaults": ("q4_0", None, {}, True),
}
# environment set for a product alone (runtime/spirv_spec.py)
ENVIRONMENT = {
    "f16, constants frozen into the SPIR-V": {"FUSEC_SPEC_CONSTANTS": "freeze"},
    "q4_0, constants as the SPIR-V's defaults": {"FUSEC_SPEC_CONSTANTS": "defaults"},
}


def main(argv: list[str]) -> int:
    build = Build.load(argv[0])
    names = argv[1:] or list(PRODUCTS)
    preset = layer.PRESETS["tiny"]
    rng = np.random.default_rng()
    failed = False
    with Device() as dev:
        for name in names:
            wdtype, attention, switches, fused = PRODUCTS[name]
            saved = {k: getattr(layer, k) for k in switches}
            saved_env = {k: os.environ.get(k) for k in ENVIRONMENT.get(name, {})}
            first = int(rng.integers(0, preset.context - 1))
            try:
                for k, v in switches.items():
                    setattr(layer, k, v)
                os.environ.update(ENVIRONMENT.get(name, {}))
                res = decode(
                    dev,
                    build,
                    preset,
                    wdtype,
                    [first, first + 1],
                    fused=fused,
                    seed=int(rng.integers(1 << 31)),
                    attention=attention,
                    persistent=False,
                )
            finally:
                for k, v in saved.items():
                    setattr(layer, k, v)
                for k, old in saved_env.items():
                    if old is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = old
            errors = [t.errors for t in res.tokens]
            paths = [[r, p] for r, p in res.report.paths]
            ok = all(
                set(e) == {"out", "kc", "vt"} and max(e.values()) <= TOLERANCE[wdtype]
                for e in errors
            ) and all((p == "fused") == fused for _, p in paths)
            failed |= not ok
            row = {"product": name, "subgroup": dev.info.subgroup_size, "ok": ok}
            print(json.dumps({**row, "pos": first, "paths": paths, "errors": errors}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
