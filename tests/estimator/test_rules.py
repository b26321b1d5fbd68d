"""Two liveness rules held on small modules (codegen/liveness.py rules 10 and 14), without a
driver; the corpus run (test_corpus.py, bench/estimator_corpus.py) holds them against ACO."""

from __future__ import annotations

import random

import pytest

from fusec.codegen.liveness import demand
from fusec.codegen.shaderc import compile_glsl

pytestmark = pytest.mark.shaderc

BRANCH = """#version 450
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint K = {k}u;
layout(set = 0, binding = 0, std430) readonly buffer A {{ float a[]; }};
layout(set = 0, binding = 1, std430) writeonly buffer B {{ float b[]; }};
void main() {{
    uint i = gl_GlobalInvocationID.x;
    float s = 0.0;
    if ((K % 2u) == 0u) {{
        s = a[i] * 2.0;
    }} else {{
        float v[{n}];
        [[unroll]] for (uint j = 0u; j < {n}u; j++) {{ v[j] = a[i * {n}u + j]; }}
        [[unroll]] for (uint j = 0u; j < {n}u; j++) {{ s += v[j] * v[({n}u - 1u) - j]; }}
    }}
    b[i] = s;
}}
"""


def test_a_branch_the_constants_decide_goes_one_way() -> None:
    """`if (K % 2 == 0)` on a specialization constant: with an even K the driver keeps the
    first arm only, so the other arm's values, all live at once, cost nothing (rule 14); with
    an odd K they are the demand.  ACO's Pre-Sched VGPRs for n = 16 (RADV null device, Mesa
    25.0.7, wave64): K = 2048, 3 on navi21 and 2 on gfx1201; K = 2047, 18 on both (the rules
    before gave 18 for both K)."""
    n = random.choice([12, 16, 20, 24])
    even = demand(compile_glsl(BRANCH.format(k=2 * random.randint(8, 2048), n=n), "even.comp"))
    odd = demand(compile_glsl(BRANCH.format(k=2 * random.randint(8, 2048) + 1, n=n), "odd.comp"))
    assert even.vgprs <= 4, even
    assert even.loads_up <= 4, even
    assert odd.vgprs >= n, odd


COPY = """#version 450
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint N = 4096u;
layout(set = 0, binding = 0, std430) readonly buffer X { float x[]; };
layout(set = 0, binding = 1, std430) readonly buffer G { float g[]; };
layout(set = 0, binding = 2, std430) writeonly buffer Y { float y[]; };
void main() {
    for (uint i = gl_GlobalInvocationID.x; i < N; i += gl_NumWorkGroups.x * 64u) {
        y[i] = exp(x[i])BODY;
    }
}
"""


def test_one_index_is_one_address() -> None:
    """A grid-stride loop that loads `x[i]` and stores `y[i]` holds `i` (for the next
    iteration), the byte offset both accesses share and the loaded value: 3 VGPRs (rule 10).
    A second load at the same index shares the offset (4 with its value); one at an index of
    its own has an offset of its own, which dies at its load (4 as well).  These are ACO's
    Pre-Sched VGPRs on navi21 and gfx1201, wave64 (RADV null device, Mesa 25.0.7,
    2026-12-02); the rules before gave 2, 3 and 3."""
    one = demand(compile_glsl(COPY.replace("BODY", ""), "one.comp"))
    same = demand(compile_glsl(COPY.replace("BODY", " * g[i]"), "same.comp"))
    other = demand(compile_glsl(COPY.replace("BODY", " * g[i ^ 1u]"), "other.comp"))
    assert (one.vgprs, same.vgprs, other.vgprs) == (3, 4, 4), (one, same, other)


UNPACK = """#version 450
#extension GL_EXT_control_flow_attributes : require
layout(local_size_x = 64) in;
layout(set = 0, binding = 0, std430) readonly buffer W { uint w[]; };
layout(set = 0, binding = 1, std430) readonly buffer X { vec4 x[]; };
layout(set = 0, binding = 2, std430) writeonly buffer Y { float y[]; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    uint o = i * 18u + 2u;
    uint u[NW];
    READ
    float s = 0.0;
    [[unroll]] for (uint j = 0u; j < NWu; j++) {
        s += dot(vec4((uvec4(u[j]) >> uvec4(0u, 8u, 16u, 24u)) & 0xffu), x[i * NWu + j]);
    }
    y[i] = s;
}
"""
ALIGNED = """if ((o & 3u) == 0u) {
        [[unroll]] for (uint j = 0u; j < NWu; j++) { u[j] = w[(o >> 2u) + j]; }
    } else {
        [[unroll]] for (uint j = 0u; j < NWu; j++) {
            u[j] = (w[(o >> 2u) + j] >> 16u) | (w[(o >> 2u) + j + 1u] << 16u);
        }
    }"""
UNALIGNED = """[[unroll]] for (uint j = 0u; j < NWu; j++) {
        u[j] = (w[(o >> 2u) + j] >> 16u) | (w[(o >> 2u) + j + 1u] << 16u);
    }"""


def test_unpacking_words_of_an_earlier_block_is_hoisted() -> None:
    """Byte words read behind an alignment branch reach the block of the `x` loads as phis;
    ACO's scheduler moves their unpacking, which does not wait on those loads, above the first
    use of the loads (`_hoist_unrelated`): each word's four floats live beside its four `x`
    values, 8 registers per word.  Read in the block of the `x` loads, the unpacking waits on
    its own words' loads and stays at its use.  The demand (our order) is the same."""
    nw = random.randint(2, 6)
    branch = demand(compile_glsl(UNPACK.replace("READ", ALIGNED).replace("NW", str(nw)), "b.comp"))
    plain = demand(compile_glsl(UNPACK.replace("READ", UNALIGNED).replace("NW", str(nw)), "p.comp"))
    assert branch.vgprs == plain.vgprs, (branch, plain)
    assert branch.loads_up >= 8 * nw > plain.loads_up - nw, (nw, branch, plain)
