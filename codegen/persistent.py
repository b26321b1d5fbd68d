"""A persistent product: a chain of regions as ONE compute shader whose workgroups take the
chain's items in topological order (docs/PERSISTENT.md).

Input: the chain as `StageSpec`s (a checked region, the call's constant values, and which
product buffer each of the region's buffers is), in the order the chain runs them, and the
subgroup size the device will run.  Output: a `Product` (`plan_product`: each region's fused
kernel re-lowered at the product's workgroup size, its item count, the earlier stages it
depends on, its bindings in the product) and its GLSL (`emit_persistent`).

Each stage's kernel is printed by the kernel printer as an item (`plan.ItemPlan`): its body a
function of its workgroup's index and count, its constants the call's values.  Its global
names (buffers, shared arrays, constants, helper functions) get a prefix of their own, `p<i>_`,
since one shader holds them all.  `main` is the scheduler: a ticket counter hands out items in
topological order (every item of stage 0, then of stage 1, ...); an item first waits until the
stages it depends on have finished all their items (lane 0 spins with relaxed loads, then one
acquiring load), runs, and adds one to its stage's counter with a release.  The last workgroup
to leave sets every counter back to 0, so the next dispatch starts from 0 (kir.Arrive's rule).
With `stamps` (a product planned with them), lane 0 of each item also writes the device clock
(GL_EXT_shader_realtime_clock) when its ticket is taken, when it starts and when it ends, into a
buffer of its own at the binding after the product's; without, not a character of it is printed.

Deadlock-freedom: an item waits only on items with smaller tickets, and a ticket is taken only
by a running workgroup, which runs the item it took before it takes another; the unfinished item
with the smallest ticket waits on nothing unfinished, so it finishes (given that running
workgroups progress).  No bound on the grid is needed for that; the grid is a matter of speed.
The `static` schedule (a variant to measure: no ticket counter, workgroup g takes items g, g + G,
...) has no such argument unless every workgroup of the grid is resident: the runtime allows it
only on a grid it can bound (docs/PERSISTENT.md).

Not done here: choosing the grid (the runtime, from the device's compute units and the
estimate), the budget gate's verdict (the runtime, on `estimate_product`), and any check that the
product computes what the chain computes (tests/runtime/test_persistent.py, against the numpy
layer and the multi-dispatch chain).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

import attrs

from fusec.dsl import ir

from . import kir
from .estimate import Estimate, estimate_sgprs, estimate_waves, lds_bytes
from .glsl import emit_glsl
from .liveness import demand
from .lower import lower_fused
from .nvidia import analyze_nvidia, estimate_nvidia_registers
from .plan import ItemPlan, plan_kernel
from .targets import Target, spill_limit
from .validate import validate_kernels

SCHEDULES = ("ticket", "static")
COUNTERS = "fusec_items"  # the product's counter buffer (a product buffer of its own)
STAMPS = "fusec_stamps"  # the optional stamp buffer: binding len(Product.buffers)
# per ticket, three device-clock readings (GL_EXT_shader_realtime_clock, two 32-bit words each,
# low word first): the ticket taken, the item started (its waits over), the item ended
STAMP_WORDS = 6
STAMP_KINDS = ("taken", "started", "ended")


@attrs.frozen
class StageSpec:
    """One region of the chain: its checked region, the call's value of every constant (the
    run-time ones too: their values do not enter the product), and the product buffer of each
    of its kernel's buffers."""

    region: ir.Region
    consts: tuple[tuple[str, int | float], ...]
    bind: tuple[tuple[str, str], ...]


@attrs.frozen
class Stage:
    """A stage of the product: the region's fused kernel at the product's workgroup size, how
    many workgroups that kernel has (an item runs `group` consecutive ones), the earlier stages
    whose items must all have finished before one of its items starts, and its item plan."""

    name: str
    kernel: kir.Kernel
    workgroups: int  # the kernel's workgroups
    depends: tuple[int, ...]
    item: ItemPlan
    group: int = 1  # consecutive workgroups an item runs (a larger item: fewer tickets and waits)

    @property
    def items(self) -> int:
        return -(-self.workgroups // self.group)


@attrs.frozen
class Product:
    stages: tuple[Stage, ...]
    workgroup_size: int
    buffers: tuple[
        str, ...
    ]  # product binding i holds product buffer buffers[i]; the last: COUNTERS
    lds_bytes: int  # the items' shared arrays side by side, and the ticket
    # how workgroups take items: "ticket" (a counter hands them out in order) or "static"
    # (workgroup g takes items g, g + G, g + 2G, ...: no counter, but every workgroup of the
    # grid must be resident, or one waits on an item whose workgroup never starts)
    schedule: str = "ticket"
    # lane 0 of each item writes the device clock (GL_EXT_shader_realtime_clock) when its ticket
    # is taken, when it starts and when it ends into the stamp buffer (binding len(buffers),
    # STAMP_WORDS words per ticket); off: the shader is the same text as without the field
    stamps: bool = False

    @property
    def items(self) -> int:
        """Items (tickets) of every stage."""
        return sum(s.items for s in self.stages)

    @property
    def counter_words(self) -> int:
        """The ticket, one finished-count per stage, and the workgroups that left."""
        return len(self.stages) + 2


class NotAnItem(Exception):
    """A region whose fused product cannot be an item: the reason, for the runtime's report."""


def item_count(kernel: kir.Kernel, consts: Mapping[str, int | float], subgroup_size: int) -> int:
    """The workgroups the kernel would be dispatched on (manifest.workgroups' rule, on the
    kernel IR): enough for the phase with the most work."""
    wg, groups = kernel.workgroup_size, 1
    for g in kernel.grid:
        extent = ir.evaluate_int(g.extent, dict(consts))
        if g.per_workgroup is not None:
            per = g.per_workgroup
        else:
            assert g.rows_per_subgroup is not None
            per = g.rows_per_subgroup * max(1, wg // subgroup_size)
        groups = max(groups, math.ceil(extent / per))
    return groups


def _item_kernel(spec: StageSpec, workgroup_size: int) -> kir.Kernel:
    """The region's fused kernel, lowered at the product's workgroup size."""
    region = spec.region
    if region.launch.workgroup_size != workgroup_size:
        launch = attrs.evolve(region.launch, workgroup_size=workgroup_size)
        region = attrs.evolve(region, launch=launch)
    kernels = lower_fused(region)
    if len(kernels) != 1:
        raise NotAnItem(f"{spec.region.name}: its fused product is {len(kernels)} kernels")
    k = kernels[0]
    validate_kernels([k])
    if k.counters or k.zero_outputs or k.loop is not None or k.atomics:
        raise NotAnItem(
            f"{spec.region.name}: its kernel has arrival counters, zeroed outputs, a loop or "
            "atomics, which items of one dispatch do not run"
        )
    return k


def plan_product(
    specs: Sequence[StageSpec],
    subgroup_size: int,
    workgroup_size: int | None = None,
    schedule: str = "ticket",
    group: int = 1,
    stamps: bool = False,
) -> Product:
    """The product of the chain `specs` (raises NotAnItem for a region that cannot be an
    item).  `workgroup_size`: the product's (default: the largest of the regions'); a region of
    another size is lowered again at it (its rows per workgroup scale with it).  `schedule`:
    SCHEDULES.  `group`: each item runs that many consecutive workgroups of its kernel.
    `stamps`: the product records device-clock stamps per item (`Product.stamps`)."""
    wg = workgroup_size or max(s.region.launch.workgroup_size for s in specs)
    if wg % subgroup_size:
        raise NotAnItem(f"workgroup size {wg} is not a multiple of subgroup size {subgroup_size}")
    kernels = [_item_kernel(s, wg) for s in specs]
    names: list[str] = []
    access: list[tuple[set[str], set[str]]] = []  # product buffers read, written, per stage
    for spec, k in zip(specs, kernels, strict=True):
        bind = dict(spec.bind)
        for b in k.bindings:
            if b.buffer.name not in bind:
                raise NotAnItem(f"{spec.region.name}: buffer '{b.buffer.name}' is not bound")
            if bind[b.buffer.name] not in names:
                names.append(bind[b.buffer.name])
        access.append(
            (
                {bind[b.buffer.name] for b in k.bindings if b.reads},
                {bind[b.buffer.name] for b in k.bindings if b.writes},
            )
        )
    names.append(COUNTERS)
    stages: list[Stage] = []
    for j, (spec, k) in enumerate(zip(specs, kernels, strict=True)):
        reads, writes = access[j]
        # read after write, write after read, write after write
        direct = [i for i in range(j) if access[i][1] & (reads | writes) or access[i][0] & writes]
        # a dependency another dependency already waited on is implied (transitive)
        implied = {d for i in direct for d in _closure(stages, i)}
        depends = tuple(i for i in direct if i not in implied)
        shared_with_others = {
            n
            for i, (r, w) in enumerate(access)
            if i != j
            for n in (w & (reads | writes)) | (writes & r)
        }
        bind = dict(spec.bind)
        item = ItemPlan(
            bindings=tuple((b.buffer.name, names.index(bind[b.buffer.name])) for b in k.bindings),
            consts=spec.consts,
            coherent=frozenset(
                b.buffer.name for b in k.bindings if bind[b.buffer.name] in shared_with_others
            ),
        )
        workgroups = item_count(k, dict(spec.consts), subgroup_size)
        stages.append(Stage(spec.region.name, k, workgroups, depends, item, group))
    lds = 4 + sum(lds_bytes(s.kernel, dict(s.item.consts)) for s in stages)
    assert schedule in SCHEDULES, schedule
    return Product(tuple(stages), wg, tuple(names), lds, schedule, stamps)


def _closure(stages: Sequence[Stage], i: int) -> set[int]:
    """Every stage that stage i waits on, directly or through another."""
    out: set[int] = set()
    todo = list(stages[i].depends)
    while todo:
        d = todo.pop()
        if d not in out:
            out.add(d)
            todo.extend(stages[d].depends)
    return out


# global declarations of a kernel's GLSL, at column 0: the names they declare
_GLOBALS = (
    re.compile(r"^layout\([^)]*\) [\w ]*buffer (\w+) \{ \w+ (\w+)\[\]; \};"),
    re.compile(r"^(?:layout\([^)]*\) )?const \w+ (\w+)\s*[\[=]"),
    re.compile(r"^shared \w+ (\w+)\["),
    re.compile(r"^#define (\w+)"),
    re.compile(r"^\w+ (\w+)\("),
)
_DIRECTIVE = re.compile(r"^#(version|extension|pragma)\b")
_WORD = re.compile(r"\b[A-Za-z_]\w*\b")


def _prefixed(text: str, prefix: str) -> tuple[list[str], list[str]]:
    """A kernel's GLSL split into its directives (#version, #extension, #pragma) and the rest,
    every global name of the rest prefixed with `prefix`."""
    directives: list[str] = []
    rest: list[str] = []
    for line in text.splitlines():
        (directives if _DIRECTIVE.match(line) else rest).append(line)
    declared: set[str] = set()
    for line in rest:
        for pattern in _GLOBALS:
            m = pattern.match(line)
            if m:
                declared |= set(m.groups())
    out = []
    for line in rest:
        if line.startswith("#line"):
            out.append(line)  # its file name is a string, not a GLSL name
            continue
        out.append(_WORD.sub(lambda m: prefix + m[0] if m[0] in declared else m[0], line))
    return directives, out


_SEM = "gl_StorageSemanticsBuffer | gl_StorageSemanticsShared, gl_SemanticsAcquireRelease"
_QF = "gl_ScopeQueueFamily"


def emit_persistent(product: Product, line_directives: bool = True) -> str:
    """The GLSL of the product: every stage's item function, and the scheduler (`main`)."""
    directives: list[str] = []
    bodies: list[str] = []
    for i, s in enumerate(product.stages):
        plan = attrs.evolve(plan_kernel(s.kernel), item=s.item)
        text = emit_glsl(s.kernel, line_directives, plan)
        ds, rest = _prefixed(text, f"p{i}_")
        directives += [x for x in ds if x not in directives and not x.startswith("#version")]
        bodies += rest
    for line in (
        "#extension GL_KHR_memory_scope_semantics : require",
        *(["#extension GL_EXT_shader_realtime_clock : require"] if product.stamps else []),
        "#pragma use_vulkan_memory_model",
    ):
        if line not in directives:
            directives.append(line)
    # the memory model pragma goes after every #extension
    directives.sort(key=lambda x: x.startswith("#pragma"))
    n = len(product.stages)
    head = [
        "#version 450",
        *directives,
        f"// persistent product: {', '.join(s.name for s in product.stages)}",
        f"layout(local_size_x = {product.workgroup_size}) in;",
        f"layout(set = 0, binding = {len(product.buffers) - 1}, std430) coherent buffer "
        f"B_{COUNTERS} {{ uint b_{COUNTERS}[]; }};",
        f"// b_{COUNTERS}[0]: the next ticket; [1 + s]: items of stage s finished; "
        f"[{n + 1}]: workgroups that left",
        "shared uint p_ticket;",
        *(_stamp_head(product) if product.stamps else []),
    ]
    c = f"b_{COUNTERS}"
    if product.schedule == "ticket":
        take = [
            "        if (gl_LocalInvocationIndex == 0u) {",
            f"            p_ticket = atomicAdd({c}[0], 1u, {_QF}, gl_StorageSemanticsBuffer, "
            "gl_SemanticsRelaxed);",
            "        }",
            "        barrier();",
            "        uint t = p_ticket;",
            "        barrier();  // p_ticket is read before the next ticket is written",
        ]
    else:  # static: every workgroup resident (the grid's bound), items in order per workgroup
        take = ["        uint t = gl_WorkGroupID.x + p_round * gl_NumWorkGroups.x;"]
    main = [
        "void main() {",
        "    for (uint p_round = 0u;; ++p_round) {",
        *take,
        f"        if (t >= {product.items}u) {{",
        "            break;",
        "        }",
        *(_stamp("        ", "taken") if product.stamps else []),
    ]
    waited_on = {d for s in product.stages for d in s.depends}
    first = 0
    for i, s in enumerate(product.stages):
        end = first + s.items
        main.append(f"        {'if' if i == 0 else '} else if'} (t < {end}u) {{")
        if s.depends:
            main.append("            if (gl_LocalInvocationIndex == 0u) {")
            for d in s.depends:
                count = product.stages[d].items
                main += [
                    f"                // stage {d} ({product.stages[d].name}): all its items",
                    f"                while (atomicLoad({c}[{d + 1}], {_QF}, "
                    f"gl_StorageSemanticsBuffer, gl_SemanticsRelaxed) < {count}u) {{",
                    "                }",
                    f"                atomicLoad({c}[{d + 1}], {_QF}, gl_StorageSemanticsBuffer, "
                    "gl_SemanticsAcquire);",
                ]
            main += [
                "            }",
                f"            controlBarrier(gl_ScopeWorkgroup, {_QF}, {_SEM});",
            ]
        if product.stamps:
            main += _stamp("            ", "started")
        if s.group == 1:
            main.append(f"            p{i}_item(t - {first}u, {s.workgroups}u);")
        else:  # a larger item: consecutive workgroups, a barrier between (shared memory reuse)
            main += [
                f"            for (uint w = (t - {first}u) * {s.group}u; "
                f"w < min((t - {first}u + 1u) * {s.group}u, {s.workgroups}u); ++w) {{",
                f"                p{i}_item(w, {s.workgroups}u);",
                "                barrier();",
                "            }",
            ]
        if i in waited_on:
            main += [
                f"            controlBarrier(gl_ScopeWorkgroup, {_QF}, {_SEM});",
                "            if (gl_LocalInvocationIndex == 0u) {",
                # before the release: a stage that waits on this one starts after it
                *([f"                p_stamp(t, {STAMP_KINDS.index('ended')}u);"] * product.stamps),
                f"                atomicAdd({c}[{i + 1}], 1u, {_QF}, gl_StorageSemanticsBuffer, "
                "gl_SemanticsRelease);",
                "            }",
            ]
        else:
            main.append("            barrier();  // no stage waits on this one")
            if product.stamps:
                main += _stamp("            ", "ended")
        first = end
    main += [
        "        }",
        "    }",
        "    // the last workgroup to leave sets the counters back to 0 for the next dispatch",
        "    if (gl_LocalInvocationIndex == 0u) {",
        f"        uint left = atomicAdd({c}[{n + 1}], 1u, {_QF}, gl_StorageSemanticsBuffer, "
        "gl_SemanticsAcquireRelease);",
        "        if (left == gl_NumWorkGroups.x - 1u) {",
        f"            for (uint i = 0u; i < {n + 2}u; ++i) {{",
        f"                atomicStore({c}[i], 0u, {_QF}, gl_StorageSemanticsBuffer, "
        "gl_SemanticsRelaxed);",
        "            }",
        "        }",
        "    }",
        "}",
    ]
    return "\n".join(head + bodies + main) + "\n"


def _stamp_head(product: Product) -> list[str]:
    """The stamp buffer and the function lane 0 calls to write a stamp."""
    b = f"b_{STAMPS}"
    return [
        f"layout(set = 0, binding = {len(product.buffers)}, std430) writeonly buffer "
        f"B_{STAMPS} {{ uint {b}[]; }};",
        f"// {b}[{STAMP_WORDS} * t + 2 * k ...]: the device clock (low word, high word) when "
        "ticket t was taken (k = 0), its item started (1), ended (2)",
        "void p_stamp(uint t, uint k) {",
        "    uvec2 now = clockRealtime2x32EXT();",
        f"    {b}[{STAMP_WORDS}u * t + 2u * k] = now.x;",
        f"    {b}[{STAMP_WORDS}u * t + 2u * k + 1u] = now.y;",
        "}",
    ]


def _stamp(indent: str, kind: str) -> list[str]:
    """Lane 0 writes stamp `kind` (STAMP_KINDS) of ticket t."""
    k = STAMP_KINDS.index(kind)
    return [f"{indent}if (gl_LocalInvocationIndex == 0u) {{", f"{indent}    p_stamp(t, {k}u);",
            f"{indent}}}"]  # fmt: skip


def estimate_product(product: Product, spv: bytes, target: Target, wave: int) -> Estimate:
    """The product's estimate on (target, wave), as codegen/estimate.py's for one kernel: the
    register demand measured on its SPIR-V (its items are branches of one loop, so the most any
    of them needs), LDS the items' side by side."""
    measured = demand(spv)
    unpacked = 0 if target.mixed_dot else measured.unpacked_dot - measured.vgprs
    need = measured.vgprs + measured.private_words + unpacked
    if target.vendor == "nvidia":
        need = estimate_nvidia_registers(analyze_nvidia(spv)) + measured.private_words
    wg = product.workgroup_size
    limit = spill_limit(target, wave, wg)
    lds = -(-product.lds_bytes // target.lds_granule) * target.lds_granule
    reach = measured.loads_up + measured.private_words + unpacked
    waves = estimate_waves(target, wave, need, reach, lds, wg)
    sgprs = max(estimate_sgprs(s.kernel) for s in product.stages)
    return Estimate(target.name, wave, need, sgprs, lds, max(0, need - limit), waves, "", reach)
