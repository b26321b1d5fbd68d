"""Dtype-generic regions at run time (tests/data/generic.fuse): every instance and target variant
verifies on lavapipe at two of the subgroup sizes 4, 8 and 16 (conftest.rotated_sizes); the
runtime picks the instance from the weights' dtypes, the device's target (a fake mapping makes
lavapipe an sm90) and the constants a call passes."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from fusec.codegen.build import build_source, check_source, write_build
from fusec.codegen.targets import TARGETS
from fusec.runtime import decode_layer as layer
from fusec.runtime import dispatch
from fusec.runtime.device import RuntimeFailure
from tests.conftest import at_size, check_on_lavapipe, rotated_sizes

SOURCE = Path(__file__).parents[1] / "data" / "generic.fuse"


@pytest.fixture(scope="module")
def program() -> Any:
    return check_source(SOURCE.read_text(), str(SOURCE))


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("generic") / "build"
    write_build(build_source(SOURCE.read_text(), str(SOURCE)), out)
    return dispatch.Build.load(out)


def test_instances_and_target_variants(program: Any) -> None:
    shapes = {
        r.name: (r.instance.display, r.launch.workgroup_size, r.launch.rows_per_subgroup)
        for r in program.regions
    }
    assert shapes == {
        "proj": ("proj<f16>", 64, 1),
        "proj__sm90": ("proj<f16> on sm90", 64, 4),
        "proj_q8_0": ("proj<q8_0>", 64, 1),
        "proj_q8_0__sm90": ("proj<q8_0> on sm90", 64, 4),
        "proj_q4_0": ("proj<q4_0>", 64, 1),
        # `on sm90 when Wt = q4_0` beats `on sm90` beats the launch line
        "proj_q4_0__sm90": ("proj<q4_0> on sm90", 128, 2),
        "mva": ("mva<f16>", 64, 1),
        "mva_q4_0": ("mva<q4_0>", 64, 1),
        "mva_long": ("mva<q4_0>", 64, 1),
    }
    q8 = program.region("proj_q8_0")
    # `const N = 24` for q8_0; the q8_0 block raises K's lower bound from 1 to 32
    assert (q8.const("N").default, q8.const("K").lo, program.region("proj").const("K").lo) == (
        24,
        32,
        1,
    )
    # the input staged for q4_0 only: a stage `aq` stored as q8_0, read by the contraction
    assert [s.name for s in program.region("mva_q4_0").all_stages()] == ["aq", "p", "y"]
    assert [s.name for s in program.region("mva").all_stages()] == ["p", "y"]
    assert program.region("mva_long").const("K").default == 512


@pytest.mark.slow
@pytest.mark.parametrize(("width", "subgroup"), [(128, 4), (256, 8), (512, 16)])
def test_every_instance_verifies_at_lavapipe_subgroup_sizes(
    root: Path, program: Any, width: int, subgroup: int
) -> None:
    names = [r.name for r in program.regions]
    assert len(names) == 9
    # by the generic region an instance comes from (proj, mva)
    kinds: dict[str, list[str]] = {}
    for n in names:
        kinds.setdefault(n.split("_")[0], []).append(n)
    here = at_size(rotated_sizes(kinds), subgroup)
    args = [a for n in here for a in ("--region", n)]
    out = check_on_lavapipe(
        [str(SOURCE.relative_to(root)), *args, "--const", "N=37"], width, subgroup
    )
    assert out.count(" ok\n") == len(here) and all(f"\n{n} [" in out for n in here)


@pytest.mark.parametrize(
    ("fake", "want", "workgroup"), [(None, "proj_q4_0", 64), ("sm90", "proj_q4_0__sm90", 128)]
)
def test_the_device_target_picks_the_variant(
    dev: Any,
    build: Any,
    program: Any,
    monkeypatch: pytest.MonkeyPatch,
    fake: str | None,
    want: str,
    workgroup: int,
) -> None:
    from fusec.runtime.verify import check_region

    if fake is not None:  # lavapipe taken for an sm90
        monkeypatch.setattr(dispatch, "target_for_device", lambda name: TARGETS[fake])
    chosen = build.instance(dev, "proj", {"W": "q4_0"})
    assert (chosen.name, chosen.launch.workgroup) == (want, workgroup)
    # and it runs: fused and unfused against the reference, on fresh random inputs
    rep = check_region(dev, build, program.region(chosen.name), {"K": 320, "N": 45})
    assert rep.path == "fused"
    assert rep.ok, [(o.name, o.fused_error, o.unfused_error) for o in rep.outputs]


def test_the_constants_a_call_passes_pick_among_instances_of_one_dtype(
    dev: Any, build: Any
) -> None:
    assert build.instance(dev, "mva", {"W": "q4_0"}, {"K": 512, "N": 36}).name == "mva_long"
    assert build.instance(dev, "mva", {"W": "q4_0"}, {"K": 128}).name == "mva_q4_0"
    assert build.instance(dev, "mva", {"W": "q4_0"}).name == "mva_q4_0"
    assert build.instance(dev, "mva", {"W": "f16"}).name == "mva"
    with pytest.raises(Exception, match="no instance of mva for W: q8_0"):
        build.instance(dev, "mva", {"W": "q8_0"})


class _Asked:
    """An instance source that records what the layer asks for."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, dict[str, str], str | None]] = []

    def instance(
        self,
        generic: str,
        dtypes: Mapping[str, str],
        target: str | None = None,
        consts: Mapping[str, int | float] | None = None,
    ) -> Any:
        self.asked.append((generic, dict(dtypes), target))

        class Found:
            name = f"{generic}@{'/'.join(dtypes.values())}@{target}"

        return Found()


def test_the_layer_asks_for_each_projection_by_its_weights_dtype_and_the_target() -> None:
    asked = _Asked()
    names = [
        c.region
        for c in layer.calls(layer.PRESETS["tiny"], "q4_k_m", regions=asked, target="gfx1201")
    ]
    assert asked.asked == [
        ("rms_norm_mul_matvec", {"W": "q4_K"}, "gfx1201"),
        ("rms_norm_mul_matvec", {"W": "q6_K"}, "gfx1201"),
        ("matvec_add", {"W": "q4_K"}, "gfx1201"),
        ("rms_norm_gated_ffn", {"Wg": "q4_K", "Wu": "q4_K"}, "gfx1201"),
        ("matvec_add", {"W": "q6_K"}, "gfx1201"),
        # attention's regions are named, not generic: each is asked for its target's variant
        ("rope_kv_store_qk_v", {}, "gfx1201"),
        ("attention_split", {}, "gfx1201"),
        ("attention_combine", {}, "gfx1201"),
    ]
    assert names[:2] == ["rms_norm_mul_matvec@q4_K@gfx1201", "rms_norm_mul_matvec@q6_K@gfx1201"]
    assert names[2:5] == [
        "rope_kv_store_qk_v@@gfx1201",
        "attention_split@@gfx1201",
        "attention_combine@@gfx1201",
    ]
    # without a build, kernels.fuse as checked answers, by the same rule
    plain = [c.region for c in layer.calls(layer.PRESETS["qwen3-8b"], "q4_0")]
    assert "matvec_add_q4_0" in plain and plain[-1] == "matvec_add_q4_0_long"
    assert "attention_combine_store" in plain
    # a named region with a schedule line of its own for the target runs as that variant, a
    # region without one (the f16 FFN has none for sm90) as itself
    sm90 = [c.region for c in layer.calls(layer.PRESETS["qwen3-8b"], "q4_0", target="sm90")]
    assert "attention_combine_store__sm90" in sm90 and "attention_rope_split__sm90" in sm90
    f16 = [c.region for c in layer.calls(layer.PRESETS["qwen3-8b"], "f16", target="sm90")]
    assert "rms_norm_gated_ffn" in f16 and "attention_rope_split__sm90" in f16


def test_a_build_without_the_layers_attention_regions_is_refused_in_one_sentence() -> None:
    class ProjectionsOnly(_Asked):
        def instance(self, generic: str, dtypes: Mapping[str, str], *args: Any) -> Any:
            return super().instance(generic, dtypes, *args) if dtypes else None

    with pytest.raises(RuntimeFailure, match=r"the build has no region attention_rope_split"):
        layer.calls(layer.PRESETS["tiny"], "q4_0", regions=ProjectionsOnly(), target="sm90")
