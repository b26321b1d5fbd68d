"""Run a region with stages in grid several times on one runner (child process of
tests/runtime/test_grid.py, so that lavapipe's environment variables apply to it alone).

`python tests/runtime/grid_runs.py BUILD_DIR REGION RUNS [NAME=VALUE]...`: one runner, RUNS runs
of the fused product, each on fresh random inputs (outputs poisoned first), every output
compared with the numpy reference, and the arrival counters read back after each run (they
must be 0 again: the next dispatch starts from there).  Then one command buffer with the fused
product recorded twice, submitted twice.  Prints one line per run; exit 1 on any mismatch.
"""

from __future__ import annotations

import sys

import numpy as np

from fusec.dsl.check import check
from fusec.dsl.parse import parse
from fusec.dsl.reference import run_reference
from fusec.runtime.device import Device
from fusec.runtime.dispatch import (
    NP_DTYPES,
    Build,
    RegionRunner,
    begin_commands,
    const_values,
    shape_of,
    submit,
)
from fusec.runtime.verify import random_inputs, relative_error, tolerance_for


def main(argv: list[str]) -> int:
    folder, name, runs = argv[0], argv[1], int(argv[2])
    given = {k: float(v) if "." in v else int(v) for k, v in (a.split("=") for a in argv[3:])}
    build = Build.load(folder)
    region = build.region(name)
    source = (build.path / "source.fuse").read_text()
    region_ir = next(r for r in check(parse(source, "source.fuse")).regions if r.name == name)
    values = const_values(region, given)
    _, tol = tolerance_for(region)
    bad = 0
    with Device() as dev:
        runner = RegionRunner(dev, build, name, values)
        try:
            counters = sorted(region.counters())
            bufs = {b.name: b for b in region.intermediates}
            rng = np.random.default_rng(1234)
            for i in range(runs):
                inputs = random_inputs(region, values, rng)
                ref = run_reference(region_ir, inputs, values)
                got = runner.run(inputs, fused=True)
                errs = [relative_error(got.outputs[b.name], ref[b.name]) for b in region.outputs]
                left = [
                    int(runner.buffer(c).download(np.uint32, shape_of(bufs[c], values)).max())
                    for c in counters
                ]
                ok = all(e <= tol for e in errs) and not any(left)
                bad += not ok
                print(
                    f"run {i}: {got.path}, {got.dispatches} dispatch(es), "
                    f"subgroup {got.subgroup_sizes}, max rel err {max(errs):.3g} "
                    f"(tol {tol}), counters after {left}: {'ok' if ok else 'MISMATCH'}"
                )
            # one command buffer, the fused product twice, submitted twice: four dispatches
            inputs = random_inputs(region, values, rng)
            ref = run_reference(region_ir, inputs, values)
            path, kernels = runner.choose(True)
            runner.prepare(inputs)
            pipelines, sizes = runner.pipelines_for(kernels)
            cmd = begin_commands(dev)
            n, _ = runner.record(cmd, [*kernels, *kernels], pipelines * 2, sizes * 2)
            dev.vk.vkEndCommandBuffer(cmd)
            for j in range(2):
                submit(dev, cmd)
                errs = [
                    relative_error(
                        runner.buffer(b.name).download(NP_DTYPES[b.dtype], shape_of(b, values)),
                        ref[b.name],
                    )
                    for b in region.outputs
                ]
                ok = all(e <= tol for e in errs)
                bad += not ok
                print(
                    f"replay {j}: {path}, {n} dispatch(es) recorded, max rel err {max(errs):.3g}: "
                    f"{'ok' if ok else 'MISMATCH'}"
                )
            dev.vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cmd])
            for p in pipelines:
                p.destroy()
        finally:
            runner.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
