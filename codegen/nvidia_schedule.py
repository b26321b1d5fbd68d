"""The order a register-minimizing list scheduler gives the rows of one block
(codegen/liveness.py rows: the elements each instruction defines and uses), for the NVIDIA count
(codegen/nvidia.py `least`).

NVIDIA's compiler schedules each block's instructions itself and trades instruction-level
parallelism against registers (CUDA C++ Best Practices Guide, "Register Pressure"; the
`-maxrregcount` and `__launch_bounds__` sections of the CUDA C++ Programming Guide: with fewer
registers allowed, it reorders and rematerializes rather than spill).  The least it can need is
then not the demand of our SPIR-V order, even with every load at its first use: an unrolled
contraction whose steps shaderc emitted as "all the weight reads, then all the dot products"
needs only one step's values at a time once each step's products follow its reads.

`least_order` is a bottom-up list scheduler (the classic register-pressure heuristic): walking
from the block's end, it places next, among the rows whose users are all placed, the one that
adds the fewest registers to what is live (the registers its uses bring to life less those its
definitions end), ties to the later row of the original order.  Dependencies kept: a use after
its definition, a redefinition after the uses of the value it replaces, the block's memory
accesses and barriers in their order, and a selection's arms before the values that merge
them (codegen/liveness_moves.py `_selects`).
"""

from __future__ import annotations

import heapq

from .liveness_moves import _Row

# blocks longer than this keep their order (the dependencies cost up to the square of a block's
# rows; the longest blocks are register tiles, which have no integer dot products)
MOST_ROWS = 3000


def least_order(rows: list[_Row], live_at_end: set[int], vcost: dict[int, float]) -> list[_Row]:
    """`rows` in the order of the module docstring's scheduler."""
    n = len(rows)
    if n < 3 or n > MOST_ROWS:
        return rows
    succs: list[set[int]] = [set() for _ in rows]
    made: dict[int, int] = {}  # element -> the row defining it last
    read: dict[int, list[int]] = {}  # element -> rows reading it since that definition
    fence = -1  # the last memory access, barrier or selection end
    for j, r in enumerate(rows):
        for e in r.uses:
            i = made.get(e)
            if i is not None:
                succs[i].add(j)
        for e in r.defs:
            for i in read.get(e, ()):
                if i != j:
                    succs[i].add(j)
            i = made.get(e)
            if i is not None:
                succs[i].add(j)
        if r.memory or r.arm_end or (r.defs and not r.uses and not r.movable):
            # memory in order; values merged by a selection (phis) after its arms
            if fence >= 0:
                succs[fence].add(j)
            if r.memory or r.arm_end:
                fence = j
        for e in r.uses:
            read.setdefault(e, []).append(j)
        for e in r.defs:
            made[e] = j
            read[e] = []
    waiting = [len(s) for s in succs]
    preds: list[list[int]] = [[] for _ in rows]
    for i, s in enumerate(succs):
        for j in s:
            preds[j].append(i)
    live = set(live_at_end)
    touching: dict[int, list[int]] = {}  # element -> the rows that define or use it
    for i, r in enumerate(rows):
        for e in r.defs | r.uses:
            touching.setdefault(e, []).append(i)

    def key(i: int) -> tuple[float, int]:
        r = rows[i]
        grow = sum(vcost.get(e, 0) for e in r.uses if e not in live)
        grow -= sum(vcost.get(e, 0) for e in r.defs if e in live)
        return (grow, -i)

    # the ready rows by key; an entry whose key has changed since is skipped when it surfaces
    current: dict[int, tuple[float, int]] = {}
    heap: list[tuple[float, int]] = []
    for i in range(n):
        if not waiting[i]:
            current[i] = key(i)
            heapq.heappush(heap, current[i])
    out: list[int] = []
    while heap:
        k = heapq.heappop(heap)
        best = -k[1]
        if current.get(best) != k:
            continue
        del current[best]
        out.append(best)
        r = rows[best]
        changed = (r.defs & live) | (r.uses - live)
        live -= r.defs
        live |= r.uses
        for e in changed:
            for i in touching.get(e, ()):
                if i in current:
                    current[i] = key(i)
                    heapq.heappush(heap, current[i])
        for p in preds[best]:
            waiting[p] -= 1
            if not waiting[p]:
                current[p] = key(p)
                heapq.heappush(heap, current[p])
    if len(out) != n:  # a cycle cannot arise from program order; keep it if it did
        return rows
    return [rows[i] for i in reversed(out)]
