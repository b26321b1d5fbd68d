"""A probe of ACO's scheduler (docs/ESTIMATOR.md, "Occupancy as ACO sets it"): a loop whose
iterations each hold 32 independent vec4 loads, and `held` values kept across the loop, so that
the demand is `held` plus a few and the scheduler has loads enough to move up to its bound.

Run in a child process whose environment picks the driver (RADV's null device,
`runtime.actual.radv_env`): `python -m tests.estimator.probe WAVE WORKGROUP HELD[,HELD...]`
prints one JSON line per `held`: the demand we measure, ACO's Pre-Sched VGPRs and VGPRs.
"""

from __future__ import annotations

import json
import sys

SOURCE = """#version 450
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = {wg}) in;
layout(set = 0, binding = 0, std430) readonly buffer A {{ vec4 a[]; }};
layout(set = 0, binding = 1, std430) buffer B {{ float b[]; }};
void main() {{
    uint i = gl_LocalInvocationIndex + gl_WorkGroupID.x * {wg}u;
    float held[{held} + 1];
    [[unroll]] for (uint t = 0u; t < {held}u; t++) held[t] = b[i + t * 4096u];
    float acc = 0.0;
    for (uint k = 0u; k < 64u; k++) {{
        [[unroll]] for (uint u = 0u; u < 32u; u++) {{
            vec4 w = a[(k * 32u + u) * 1024u + i];
            acc += dot(w, w);
        }}
    }}
    float s = acc;
    [[unroll]] for (uint t = 0u; t < {held}u; t++) s += held[t] * float(t + 1u);
    b[i] = s;
}}
"""


def glsl(workgroup: int, held: int) -> str:
    return SOURCE.format(wg=workgroup, held=held)


def main(argv: list[str]) -> int:
    from fusec.codegen.liveness import demand
    from fusec.codegen.shaderc import compile_glsl
    from fusec.runtime.device import Device
    from fusec.runtime.pipelines import Pipeline, pipeline_statistics

    wave, workgroup = int(argv[0]), int(argv[1])
    with Device(capture_statistics=True) as dev:
        for held in (int(h) for h in argv[2].split(",")):
            spv = compile_glsl(glsl(workgroup, held), "probe.comp")
            p = Pipeline(dev, spv, 2, [], wave, workgroup % wave == 0, capture_statistics=True)
            try:
                st = pipeline_statistics(dev, p)
            finally:
                p.destroy()
            measured = demand(spv)
            row = {
                "held": held,
                "demand": measured.vgprs,
                "loads_up": measured.loads_up,
                "presched": int(st["Pre-Sched VGPRs"]),
                "vgprs": int(st["VGPRs"]),
            }
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
