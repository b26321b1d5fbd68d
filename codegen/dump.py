"""Region -> text of its kernels, without compiling: `fusec build FILE --dump kir|glsl` and
the goldens (tests/golden/).

Input: a checked region.  Output: the kernel IR (`kir_print.format_kernel`) or the GLSL
(`glsl.emit_kernel`, without `#line` directives, so that the text does not move when a line of
the source does) of every kernel a build makes for it, in the build's order: the fused product,
the unfused chain, then a tile region's shared-memory variant.

Not done here: SPIR-V, estimates, the manifest (`build.py`).
"""

from __future__ import annotations

from fusec.dsl import ir

from . import kir
from .build import products
from .glsl import emit_kernel
from .kir_print import format_kernel
from .plan import plan_kernel
from .targets import CODE_PROFILE, CodeKnobs

DUMPS = ("kir", "glsl")


def dump_source(
    text: str, path: str, what: str, targets: tuple[str, ...] = (), regions: tuple[str, ...] = ()
) -> str:
    """`dump_region` of each region of a `.fuse` text (of `regions` only, when given), checked
    as `fusec build` checks it; raises DiagnosticError on bad input or an unknown region."""
    from .build import check_source, select_regions

    program = check_source(text, path, targets)
    return "\n".join(dump_region(r, what) for r in select_regions(program, regions))


def lower_region(region: ir.Region) -> list[kir.Kernel]:
    """Every kernel a build compiles for `region`, in the build's order (build.products)."""
    return [k for product in products(region) for k in product]


def dump_region(region: ir.Region, what: str, knobs: CodeKnobs = CODE_PROFILE) -> str:
    """The kernel IR with its plan (`what` = "kir") or the GLSL ("glsl") of every kernel of
    `region`, planned with `knobs` (the build's code profile by default), one block per kernel
    separated by a blank line."""
    assert what in DUMPS, what
    blocks = []
    for k in lower_region(region):
        plan = plan_kernel(k, knobs)
        if what == "kir":
            blocks.append(format_kernel(k, plan))
        else:
            text = emit_kernel(k, line_directives=False, plan=plan)[0]
            blocks.append(f"// ---- {k.name} ----\n" + text)
    return "\n".join(blocks)
