"""Decode tokens with the decode layer's persistent product and with its multi-dispatch chain
(child process of tests/runtime/test_persistent.py, so that lavapipe's environment variables,
LP_NUM_THREADS and LP_NATIVE_VECTOR_WIDTH, apply to it alone; the parent kills it at a timeout,
which is how a deadlock fails).

`python tests/runtime/persistent_runs.py BUILD_DIR WEIGHTS FIRST LAST [TARGET]`: the tiny layer at
every pos from FIRST to LAST (lavapipe taken for the target TARGET, e.g. sm90, when given: the
layer then runs that target's `schedule on` variants, packed weights included), one recording
replayed per product, both from the same random state and inputs.  Every token's out and both
caches are compared with the numpy layer (the layer's tolerance) and with the multi-dispatch
chain's (the same tolerance: the product lowers some regions at another workgroup size, so sums
may run in another order).  Prints one JSON line;
exit 1 on any mismatch.
"""

from __future__ import annotations

import json
import sys

import numpy as np

from examples.decode_layer.run import TOLERANCE, decode
from fusec.runtime import decode_layer as layer
from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build
from fusec.runtime.verify import relative_error


def take_for(name: str) -> None:
    """Every caller of targets.target_for_device in this process gets the target `name`."""
    from examples.decode_layer import run
    from fusec.codegen import targets
    from fusec.runtime import dispatch, persistent

    target = targets.TARGETS[name]

    def fake(device_name: str) -> targets.Target | None:
        return target

    targets.target_for_device = fake
    dispatch.target_for_device = fake
    persistent.target_for_device = fake
    run.target_for_device = fake


def main(argv: list[str]) -> int:
    folder, wdtype, first, last = argv[0], argv[1], int(argv[2]), int(argv[3])
    if len(argv) > 4:
        take_for(argv[4])
    build = Build.load(folder)
    preset = layer.PRESETS["tiny"]
    positions = list(range(first, last + 1))
    seed = int(np.random.default_rng().integers(1 << 31))
    with Device() as dev:
        one = decode(dev, build, preset, wdtype, positions, seed=seed, persistent=True)
        chain = decode(dev, build, preset, wdtype, positions, seed=seed)
        tol = TOLERANCE[wdtype]
        worst = {"numpy": 0.0, "chain": 0.0, "chain_numpy": 0.0}
        for t, c, a, b in zip(one.tokens, chain.tokens, one.outputs, chain.outputs, strict=True):
            assert t.pos == c.pos
            assert set(t.errors) == {"out", "kc", "vt"}
            worst["numpy"] = max(worst["numpy"], *t.errors.values())
            worst["chain_numpy"] = max(worst["chain_numpy"], *c.errors.values())
            for name in ("out", "kc", "vt"):
                worst["chain"] = max(worst["chain"], relative_error(a[name], b[name]))
        # each token wrote its cache row: the last token's caches differ from the first's
        moved = not np.array_equal(one.outputs[0]["kc"], one.outputs[-1]["kc"]) or first == last
        print(
            json.dumps(
                {
                    "subgroup": dev.info.subgroup_size,
                    "tokens": len(positions),
                    "dispatches": one.report.dispatches,
                    "chain_dispatches": chain.report.dispatches,
                    "paths": sorted({p for _, p in one.report.paths}),
                    "regions": [r for r, _ in one.report.paths],
                    "worst": worst,
                    "moved": moved,
                }
            )
        )
        ok = all(v <= tol for v in worst.values()) and moved and one.report.dispatches == 1
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
