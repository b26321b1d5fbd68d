"""codegen/persistent.py: the decode layer's regions planned as items of one dispatch (their
order, dependencies, coherent buffers and item counts), the product's GLSL (one scheduler, an
item function per stage, names kept apart) compiled by shaderc, and regions refused as items."""

from __future__ import annotations

import re
from typing import Any

import attrs
import pytest

from fusec.codegen import persistent as pc
from fusec.codegen.glsl import emit_glsl
from fusec.codegen.lower import lower_fused
from fusec.codegen.manifest import workgroups
from fusec.codegen.plan import plan_kernel
from fusec.dsl.ir import PARAMS_BUFFER
from fusec.runtime import decode_layer as layer
from fusec.runtime.dispatch import const_values
from fusec.runtime.persistent import source_program

TINY = layer.PRESETS["tiny"]


def _specs(build: Any, wdtype: str, target: str | None = None) -> list[pc.StageSpec]:
    regions = {r.name: r for r in source_program().regions}
    specs = []
    for i, call in enumerate(layer.calls(TINY, wdtype, regions=build.manifest, target=target)):
        values = const_values(build.region(call.region), call.consts)
        bind = {**call.bind, PARAMS_BUFFER: f"{i}#params"}
        specs.append(pc.StageSpec(regions[call.region], tuple(values.items()), tuple(bind.items())))
    return specs


@pytest.mark.parametrize("subgroup", [4, 8, 16])
def test_the_layer_is_a_chain_of_items(build: Any, subgroup: int) -> None:
    product = pc.plan_product(_specs(build, "f16"), subgroup)
    names = [s.name for s in product.stages]
    assert names == [c.region for c in layer.calls(TINY, "f16", regions=build.manifest)]
    # each stage reads what the one before it wrote; nothing further back is waited on again
    assert [s.depends for s in product.stages] == [(), *((i,) for i in range(len(names) - 1))]
    assert product.workgroup_size == max(s.kernel.workgroup_size for s in product.stages) == 512
    # buffers another item reads or writes are coherent, weights and the layer's input not
    coherent = {s.name: s.item.coherent for s in product.stages}
    assert coherent["rms_norm_mul_matvec"] == {"y"}
    assert coherent["rms_norm_gated_ffn"] == {"x", "h"}
    assert product.buffers[-1] == pc.COUNTERS and len(set(product.buffers)) == len(product.buffers)
    # items: the workgroups each kernel would be dispatched on at the product's size; a
    # region launched at that size already has the build's count
    calls = layer.calls(TINY, "f16", regions=build.manifest)
    for s, call in zip(product.stages, calls, strict=True):
        (k,) = build.region(s.name).fused
        values = const_values(build.region(s.name), call.consts)
        if k.workgroup_size == 512:
            assert s.items == s.workgroups == workgroups(k, values, subgroup), s.name
    # the projections with one workgroup per row keep it: N items
    assert product.stages[-1].items == TINY.hidden
    assert product.items == sum(s.items for s in product.stages)


@pytest.mark.shaderc
@pytest.mark.parametrize("wdtype", ["f16", "q4_0", "q4_k_m"])
def test_the_product_compiles_as_one_shader(build: Any, wdtype: str) -> None:
    from fusec.codegen.shaderc import compile_glsl

    product = pc.plan_product(_specs(build, wdtype), 8)
    text = pc.emit_persistent(product)
    assert text.count("void main()") == 1
    assert text.count("layout(local_size_x") == 1
    for i in range(len(product.stages)):
        assert f"void p{i}_item(uint item_wg, uint item_count)" in text
        assert f"p{i}_item(t - " in text
    # no workgroup builtin inside the items: they take their index and count as arguments
    items = text[: text.index("void main()")]
    assert "gl_WorkGroupID" not in items and "gl_NumWorkGroups" not in items
    # one wait per dependency: a relaxed spin, then one acquire
    waits = len(re.findall(r"gl_SemanticsAcquire\);", text))
    assert waits == sum(len(s.depends) for s in product.stages) > 0
    assert compile_glsl(text, "persistent")[:4] == b"\x03\x02\x23\x07"


_BUFFER_DECL = re.compile(
    r"^layout\(set = 0, binding = (\d+), std430\) [\w ]*buffer p(\d+)_B_(\w+) "
)


@pytest.mark.parametrize(("wdtype", "target"), [("q4_0", "sm90"), ("q8_0", "sm90"), ("f16", None)])
def test_every_view_of_a_buffer_is_bound_to_the_products_binding(
    build: Any, wdtype: str, target: str | None
) -> None:
    """Each item's buffers, and their wide views (a packed weight's uvec4 `_u4`, an f16 input's
    vector views), are declared at the product's binding of that buffer, never at the region's
    own (the H200 q4_0 bug: the out projection's packed W read through binding 2, Wqkv)."""
    product = pc.plan_product(_specs(build, wdtype, target), 8)
    text = pc.emit_persistent(product)
    seen = 0
    for line in text.splitlines():
        m = _BUFFER_DECL.match(line)
        if m is None:
            continue
        binding, stage, name = int(m[1]), int(m[2]), m[3]
        item = product.stages[stage].item
        base = name if name in dict(item.bindings) else re.sub(r"_u\d+$", "", name)
        assert binding == item.binding(base), line
        seen += name != base
    assert seen > 0  # views were declared and checked
    if target is not None:
        assert any(s.name == "matvec_add_" + wdtype + "__sm90" for s in product.stages)
        assert any(
            b.buffer.packing is not None for s in product.stages for b in s.kernel.bindings
        ) == (wdtype != "f16")


@pytest.mark.shaderc
def test_the_static_schedule_takes_no_tickets(build: Any) -> None:
    from fusec.codegen.shaderc import compile_glsl

    ticket = pc.emit_persistent(pc.plan_product(_specs(build, "f16"), 8))
    static = pc.emit_persistent(pc.plan_product(_specs(build, "f16"), 8, 256, "static"))
    take = f"atomicAdd(b_{pc.COUNTERS}[0], 1u"
    assert take in ticket and take not in static
    assert "gl_WorkGroupID.x + p_round * gl_NumWorkGroups.x" in static
    assert "layout(local_size_x = 256) in;" in static
    assert compile_glsl(static, "persistent")[:4] == b"\x03\x02\x23\x07"


@pytest.mark.shaderc
def test_larger_items_take_fewer_tickets(build: Any) -> None:
    from fusec.codegen.shaderc import compile_glsl

    one = pc.plan_product(_specs(build, "f16"), 8)
    four = pc.plan_product(_specs(build, "f16"), 8, group=4)
    for a, b in zip(one.stages, four.stages, strict=True):
        assert a.workgroups == b.workgroups and b.items == -(-a.items // 4)
    assert four.items < one.items
    text = pc.emit_persistent(four)
    # the down projection's 256 workgroups: 64 items of 4, each waiting once on the FFN
    assert "w < min((t - " in text and ") * 4u, 256u); ++w) {" in text
    assert compile_glsl(text, "persistent")[:4] == b"\x03\x02\x23\x07"


def test_a_kernel_of_its_own_is_printed_as_before(build: Any) -> None:
    """The item plan is off by default: the printer's text is the build's."""
    region = next(r for r in source_program().regions if r.name == "matvec_add")
    (k,) = lower_fused(region)
    assert emit_glsl(k) == emit_glsl(k, plan=plan_kernel(k))
    assert "void main() {" in emit_glsl(k) and "item_wg" not in emit_glsl(k)


def test_a_region_of_two_kernels_is_not_an_item() -> None:
    region = next(r for r in source_program().regions if r.name == "gated_ffn_down")
    assert len(lower_fused(region)) == 2
    consts = tuple((c.name, c.default) for c in region.consts)
    bind = tuple((b.name, b.name) for b in [*region.inputs, *region.outputs])
    with pytest.raises(pc.NotAnItem, match="gated_ffn_down: its fused product is 2 kernels"):
        pc.plan_product([pc.StageSpec(region, consts, bind)], 8)


@pytest.mark.shaderc
@pytest.mark.parametrize(("schedule", "group"), [("ticket", 1), ("static", 1), ("ticket", 3)])
def test_stamps_only_add_lines_to_the_product(build: Any, schedule: str, group: int) -> None:
    """A stamped product is the plain one with lines added (the clock extension, the stamp
    buffer at the binding after the product's, and lane 0's stamps: the ticket taken once, each
    stage's start and end once), and compiles; without stamps nothing of them is printed."""
    import difflib

    from fusec.codegen.shaderc import compile_glsl

    specs = _specs(build, "f16")
    plain_product = pc.plan_product(specs, 8, None, schedule, group)
    product = pc.plan_product(specs, 8, None, schedule, group, stamps=True)
    assert product.stamps and not plain_product.stamps
    plain, text = pc.emit_persistent(plain_product), pc.emit_persistent(product)
    assert pc.emit_persistent(attrs.evolve(product, stamps=False)) == plain
    assert "clockRealtime" not in plain and pc.STAMPS not in plain and "p_stamp" not in plain
    ops = difflib.SequenceMatcher(None, plain.splitlines(), text.splitlines(), autojunk=False)
    assert {tag for tag, *_ in ops.get_opcodes()} == {"equal", "insert"}
    assert "#extension GL_EXT_shader_realtime_clock : require" in text
    binding = len(product.buffers)
    assert f"layout(set = 0, binding = {binding}, std430) writeonly buffer B_{pc.STAMPS}" in text
    n = len(product.stages)
    main = text[text.index("void main()") :]
    assert [main.count(f"p_stamp(t, {k}u);") for k in range(3)] == [1, n, n]
    # a stage someone waits on stamps its end before its release (a dependent starts after it)
    release = re.compile(r"p_stamp\(t, 2u\);\n\s+atomicAdd\(b_fusec_items\[(\d+)\], 1u.*Release")
    assert {int(m[1]) - 1 for m in release.finditer(main)} == {
        d for s in product.stages for d in s.depends
    }
    assert compile_glsl(text, "persistent")[:4] == b"\x03\x02\x23\x07"
