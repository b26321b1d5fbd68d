"""The manifest's records (codegen/manifest_records.py): `to_json(from_json(d)) == d` for every
manifest kernels.fuse builds, with the writer's bytes; the build's records are the ones its JSON
reads back as; a field changed in a record reaches the JSON and comes back."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import attrs
import pytest

from fusec.codegen import manifest as mf
from fusec.codegen import manifest_records as mr
from fusec.codegen.build import BuildResult, build_source, check_source
from fusec.codegen.targets import TARGETS
from tests.conftest import ROOT

pytestmark = pytest.mark.shaderc


def _round_trips(data: dict[str, Any], text: str) -> None:
    assert mf.schema_error(data) is None  # the published schema holds it
    m = mr.Manifest.from_json(data)
    assert m.to_json() == data
    # the same keys in the same order: the writer's bytes again
    assert json.dumps(m.to_json(), indent=1) + "\n" == text
    assert mr.Manifest.from_json(m.to_json()) == m


def test_the_session_build_round_trips(kernels_folder: Path) -> None:
    text = (kernels_folder / "manifest.json").read_text()
    _round_trips(json.loads(text), text)


def test_every_selection_of_regions_and_targets_round_trips() -> None:
    """kernels.fuse built for a fresh random choice of regions and targets."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    text = (ROOT / "kernels.fuse").read_text()
    names = [r.name for r in check_source(text, "kernels.fuse").regions]
    regions = tuple(rng.sample(names, rng.randint(1, 4)))
    targets = tuple(rng.sample(sorted(TARGETS), rng.randint(0, 3)))
    result = build_source(text, "kernels.fuse", targets, regions=regions)
    chosen = tuple(n for n in names if n in regions)
    assert tuple(r.name for r in result.manifest.regions) == chosen, seed
    assert result.manifest.options == mr.BuildOptions(targets, chosen), seed
    _round_trips(result.manifest_json, json.dumps(result.manifest_json, indent=1) + "\n")


def test_the_writer_serializes_its_records(kernels_build: BuildResult) -> None:
    """What the build holds is what its manifest.json reads back as, validated: the published
    schema holds every manifest kernels.fuse produces (checked here, not through the memo of
    content that passed before)."""
    data = kernels_build.manifest_json
    assert mf.schema_error(data) is None
    assert kernels_build.manifest.to_json() == data
    assert mf.is_sealed(data) and data["integrity"] == kernels_build.manifest.integrity
    assert mf.checked_records(data) == kernels_build.manifest


def _records(m: mr.Manifest) -> list[Any]:
    """Every record of the manifest, nested ones included (expressions left out)."""
    out: list[Any] = []
    stack: list[Any] = [m]
    while stack:
        r = stack.pop()
        out.append(r)
        for value in attrs.astuple(r, recurse=False):
            items = value if isinstance(value, tuple) else (value,)
            stack += [x for x in items if attrs.has(type(x)) and not isinstance(x, _EXPRS)]
    return out


_EXPRS = (mr.ConstRef, mr.BinOp)


def _changed(value: Any, kind: str, rng: random.Random) -> Any:
    """Another value of the field's type `kind` (an expression stays an expression)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.randint(1, 9)
    if isinstance(value, float):
        return value / 2 + 0.125
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, mr.ConstRef):
        return mr.ConstRef(value.name + "x")
    if isinstance(value, mr.BinOp):
        return attrs.evolve(value, op="*" if value.op != "*" else "+")
    if value is None:
        if kind.startswith("tuple"):
            return (0.5, 2.0)
        if "Instance" in kind or "Packed" in kind:  # an optional record: drawn where it is
            # set (its own fields)
            return None
        return mr.BuildOptions() if "BuildOptions" in kind else "x" if "str" in kind else 7
    if isinstance(value, tuple) and value and all(isinstance(x, int | float) for x in value):
        return tuple(x + 1 for x in value)
    if isinstance(value, tuple):
        return value[:-1] if value else value
    return value


def test_a_changed_field_reaches_the_json_and_comes_back(kernels_build: BuildResult) -> None:
    """For records and fields drawn at random: the JSON of the changed record differs from the
    original's and reads back as the changed record (a field the writer drops, or one the
    reader leaves at a default, fails)."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    records = _records(kernels_build.manifest)
    for record in rng.sample(records, 200):
        field = rng.choice(attrs.fields(type(record)))
        value = getattr(record, field.name)
        new = _changed(value, str(field.type), rng)
        if new == value or (isinstance(new, tuple) and new and attrs.has(type(new[0]))):
            continue  # an empty tuple, or a tuple of records (its items are drawn on their own)
        if isinstance(record, mr.Verdict):
            region = next(r for r in kernels_build.manifest.regions if record in r.verdicts)
            changed_region = attrs.evolve(
                region,
                verdicts=tuple(
                    attrs.evolve(v, **{field.name: new}) if v == record else v
                    for v in region.verdicts
                ),
            )
            assert changed_region.to_json() != region.to_json(), (seed, field.name)
            assert mr.Region.from_json(changed_region.to_json()) == changed_region, seed
            continue
        changed = attrs.evolve(record, **{field.name: new})
        assert changed.to_json() != record.to_json(), (seed, type(record).__name__, field.name)
        assert type(record).from_json(changed.to_json()) == changed, (seed, field.name)
