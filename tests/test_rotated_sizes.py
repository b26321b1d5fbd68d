"""conftest.rotated_sizes, which spreads the lavapipe subgroup-size checks over 4, 8 and 16
lanes: its promises, on generated kinds and names."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import WIDE_SHARE, at_size, rotated_sizes

NAMES = st.text("abcdefghijklmnopqrstuvwxyz_0123456789", min_size=1, max_size=12)


@st.composite
def kinds(draw: st.DrawFn) -> dict[str, list[str]]:
    names = draw(st.lists(NAMES, min_size=1, max_size=60, unique=True))
    count = draw(st.integers(1, len(names)))
    cuts: list[int] = []
    if count > 1:
        inner = st.integers(1, len(names) - 1)
        cuts = sorted(draw(st.lists(inner, max_size=count - 1, unique=True)))
    parts = [names[a:b] for a, b in zip([0, *cuts], [*cuts, len(names)], strict=True)]
    return {f"kind{i}": part for i, part in enumerate(parts)}


@given(kinds(), st.randoms())
def test_every_name_runs_at_two_sizes_and_each_kind_at_every_size(
    groups: dict[str, list[str]], rnd: random.Random
) -> None:
    sizes = rotated_sizes(groups)
    assert set(sizes) == {n for names in groups.values() for n in names}
    for kind, names in groups.items():
        for n in names:
            # two sizes, one of them away from lavapipe's default of 8
            assert len(sizes[n]) == 2 and sizes[n] <= {4, 8, 16} and sizes[n] & {4, 16}
        wide = [n for n in names if 16 in sizes[n]]
        assert len(wide) == max(1, round(len(names) / WIDE_SHARE)), (kind, names, sizes)
        if len(names) >= 2:
            assert set().union(*(sizes[n] for n in names)) == {4, 8, 16}
    # the same in every run, whatever order the names come in
    shuffled = {k: rnd.sample(v, len(v)) for k, v in groups.items()}
    assert rotated_sizes(shuffled) == sizes
    for lanes in (4, 8, 16):
        assert at_size(sizes, lanes) == sorted(n for n, s in sizes.items() if lanes in s)
