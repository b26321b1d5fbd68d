"""Targets by name, as frozen records; passes read their fields, never their names.

Sources: FACTS.md (occupancy model: Mesa 25.0 radv_get_max_waves, ACO, LLVM AMDGPU, CUDA's
occupancy header).  Issue #5 extends these records with the estimator's fields.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class Target:
    name: str
    description: str
    wave_sizes: tuple[int, ...]
    max_shared_bytes: int  # per workgroup, as Vulkan exposes it


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("gfx1201", "RDNA4 (RX 9070 XT)", (32, 64), 65536),
        Target("gfx1200", "RDNA4 (RX 9060)", (32, 64), 65536),
        Target("gfx1151", "RDNA3.5 (Strix Halo)", (32, 64), 65536),
        Target("navi31", "RDNA3 (RX 7900)", (32, 64), 65536),
        Target("navi21", "RDNA2 (RX 6900)", (32, 64), 65536),
        Target("sm90", "Hopper (H100/H200) through Vulkan", (32,), 49152),
    )
}
