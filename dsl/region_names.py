"""Regions named on the command line: `--region NAME` -> the names of the regions meant.

Input: the regions of a program (region IR or syntax) or of a manifest, and the names a user
typed.  Output: each name as the region's own name; an instance answers to its display name too
(`gated_ffn<q4_0>` for `gated_ffn_q4_0`, `R<q4_0> on sm90` for its target variant), the naming
rule's instance before one an `instance` line named where both show alike.  An unknown name is
a diagnostic whose hint lists the names near it (or every region when none is near).

`fusec build --dump`, check, bench, explain, occupancy and tune all resolve through here.  Not
done here: building, or deciding which regions a command runs when none is named.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Protocol

from . import syntax as S
from .diagnostics import Diagnostic, DiagnosticError
from .instances import InstanceLike


class NamedRegion(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def instance(self) -> InstanceLike | None: ...


def display_name(r: NamedRegion) -> str:
    """How listings show a region: an instance by its display name, any other by its name."""
    i = r.instance
    return r.name if i is None else S.Instance(i.generic, i.bindings, i.target).display


def resolve_regions(
    regions: Sequence[NamedRegion], names: Sequence[str], path: str
) -> tuple[str, ...]:
    """The region name of each of `names` (a region's name or an instance's display name), in
    their order; DiagnosticError for the first that names no region of `regions` (from `path`)."""
    shown: dict[str, str] = {}
    for r in regions:
        if r.instance is not None:
            shown.setdefault(display_name(r), r.name)
    known = {r.name for r in regions}
    out = []
    for n in names:
        name = n if n in known else shown.get(n)
        if name is None:
            raise DiagnosticError([unknown_region(n, regions, path)])
        out.append(name)
    return tuple(out)


def unknown_region(name: str, regions: Sequence[NamedRegion], path: str) -> Diagnostic:
    """`no region 'NAME' in PATH`, the hint naming the regions near `name` (by name or display
    name), or every region when none is near."""
    spelled = list(dict.fromkeys(s for r in regions for s in (display_name(r), r.name)))
    near = difflib.get_close_matches(name, spelled, n=6, cutoff=0.6)
    if near:
        hint = "did you mean " + ", ".join(near) + "?"
    else:
        hint = "regions: " + (", ".join(r.name for r in regions) or "none")
    return Diagnostic(None, f"no region '{name}' in {path}", hint)


def variant_of(r: NamedRegion) -> tuple[str, str] | None:
    """(the region it is a variant of, the target) for a target variant (`R__sm90`, made by
    `schedule on sm90` lines), None for any other region."""
    i = r.instance
    if i is None or i.target is None or not r.name.endswith(f"__{i.target}"):
        return None
    return r.name[: -len(f"__{i.target}")], i.target


def with_variants(
    regions: Sequence[NamedRegion], names: Sequence[str], targets: Sequence[str] = ()
) -> tuple[str, ...]:
    """`names` (resolved region names) followed by their target variants, those for `targets`
    only when given: what runs on each target is the variant where there is one, so a command
    about region R on a target shows R's variant too."""
    wanted = set(names)
    found = ((r.name, variant_of(r)) for r in regions)
    extra = [
        name
        for name, v in found
        if v is not None
        and v[0] in wanted
        and name not in wanted
        and (not targets or v[1] in targets)
    ]
    return (*names, *extra)
