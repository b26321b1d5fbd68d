"""The C header `fusec export` writes: a validated manifest and its SPIR-V as C99 text.

Input: a manifest that runtime/prebuilt.py validated, and the checked bytes of its modules.
Output: one self-contained header (no Python and no build folder at run time): every kernel's
SPIR-V as a `uint32_t` array; per kernel its bindings, specialization constants, local size,
subgroup sizes, shared memory and grid, the sizes as C functions of the region's constants;
per region the fused product, the shared-exchange alternative where the build has one, and the
unfused chain, each as steps in dispatch order that say where a barrier goes (`schedule`, as
`runtime/dispatch.py` records them), and a function that refuses constants the region cannot
run at.  The same input gives the same bytes.  docs/ENGINE.md describes the header.
Not here: validation (runtime/export.py does it before calling `emit_header`), and the budget
gate and device checks by which the Python runtime picks the fused product
(`RegionRunner.choose`): an engine makes its own choice, with the kernels' `features`, shared
memory and subgroup sizes that the header gives it.
"""

from __future__ import annotations

import hashlib
import math
import re
import struct
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from fusec.codegen import manifest as mf
from fusec.codegen import manifest_records as mr
from fusec.dsl.diagnostics import Diagnostic, DiagnosticError
from fusec.dsl.ir import PARAMS_BUFFER
from fusec.dsl.types import block_noun

# the first line of every header this module writes: a file whose first line differs is not
# ours and is never replaced
MARKER = "/* fusec-generated-header: written by `fusec export`; regenerate it, do not edit */"
# /2: fusec_kernel gained counter_count and counters (stages in grid), FUSEC_FEATURE_FLOAT64
HEADER_FORMAT = "fusec-c-header/2"

# the C enumerators of fusec_dtype, in value order (new dtypes go at the end)
_DTYPES = ("u32", "i32", "f32", "f16", "q8_0", "q4_0", "q8_0x", "q4_K", "q6_K")
# the manifest's `features`, as the header's FUSEC_FEATURE_* bits
_FEATURES = (
    "storage_buffer_16bit",
    "atomic_float_add",
    "integer_dot_product",
    "vulkan_memory_model",
    "float64",
)
_SUBGROUP_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
_PRODUCTS = ("fused", "fused_shared", "unfused")


def _fail(message: str, hint: str | None = None) -> DiagnosticError:
    return DiagnosticError([Diagnostic(None, message, hint)])


# ---- names and literals ----


def c_string(text: str) -> str:
    """`text` as a C string literal (ASCII; anything else escaped in octal)."""
    out = []
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= code < 127 and ch != "?":  # `?` could begin a trigraph
            out.append(ch)
        else:
            out += [f"\\{b:03o}" for b in ch.encode()]
    return '"' + "".join(out) + '"'


def c_comment(text: str) -> str:
    """`text` safe inside a C block comment."""
    return text.replace("*/", "* /").replace("/*", "/ *")


def _f32_literal(v: float) -> str:
    """`v` rounded to f32, as the shortest C literal that reads back as that f32."""
    f32 = _f32(v)
    if f32.is_integer() and abs(f32) < 1e9:
        text = f"{int(f32)}.0"
        if f32 == 0 and math.copysign(1.0, f32) < 0:
            text = "-0.0"
    else:
        text = next(t for t in (f"{f32:.{p}g}" for p in range(1, 10)) if _f32(float(t)) == f32)
    if not any(ch in text for ch in ".en"):
        text += ".0"
    return text + "f"


def _f32(v: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", v))[0])


def _double_literal(v: float) -> str:
    text = repr(float(v))
    return text if any(ch in text for ch in ".e") else text + ".0"


class _Names:
    """C identifiers for manifest names: characters other than letters, digits and `_` become
    `_`; a name that then equals one given before gets `_2`, `_3`, ... (first come, first
    served, in manifest order)."""

    def __init__(self) -> None:
        self.taken: set[str] = set()

    def make(self, name: str) -> str:
        base = re.sub(r"[^A-Za-z0-9_]", "_", name)
        ident, n = base, 1
        while ident in self.taken:
            n += 1
            ident = f"{base}_{n}"
        self.taken.add(ident)
        return ident


# ---- expressions ----


class _Exprs:
    """Manifest size expressions as numbered C functions of the constants (`fusec_e<n>`).
    `u64`: as the runtime evaluates shapes and grids (unbounded integers there; in C, 64-bit
    unsigned, exact below 2^64); `u32`: as a shader computes a derived constant, every step
    modulo 2^32 (`codegen.manifest.eval_u32`).  A zero divisor gives 0 in C; the region's
    `check` function refuses constants that make one."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.defs: list[str] = []
        self.seen: dict[tuple[str, str], str] = {}

    def _c(self, e: mr.Expr, index: Mapping[str, int], dtypes: Mapping[str, str], ty: str) -> str:
        if isinstance(e, int):
            return f"(({ty}){e}u)"
        if isinstance(e, mr.ConstRef):
            i = index[e.name]
            field = {"u32": "u", "i32": "i", "f32": "f"}[dtypes[e.name]]
            if field == "i":
                return f"(({ty})(int64_t)c[{i}].i)"
            return f"(({ty})c[{i}].{field})"
        lhs, rhs = self._c(e.lhs, index, dtypes, ty), self._c(e.rhs, index, dtypes, ty)
        op = e.op
        if op in ("/", "%"):
            helper = "div" if op == "/" else "mod"
            bits = "64" if ty == "uint64_t" else "32"
            return f"fusec_{helper}{bits}({lhs}, {rhs})"
        return f"(({ty})({lhs} {op} {rhs}))"

    def function(
        self,
        e: mr.Expr,
        index: Mapping[str, int],
        dtypes: Mapping[str, str],
        wrap32: bool = False,
    ) -> str:
        """The name of a function `uint64_t f(const fusec_value *c)` computing `e`."""
        ty = "uint32_t" if wrap32 else "uint64_t"
        body = self._c(e, index, dtypes, ty)
        key = (ty, body)
        if key in self.seen:
            return self.seen[key]
        name = f"{self.prefix}_e{len(self.defs)}"
        self.seen[key] = name
        text = c_comment(mf.format_expr(e))
        self.defs.append(
            f"static inline uint64_t {name}(const fusec_value *c)\n"
            f"{{ /* {text}{' (modulo 2^32)' if wrap32 else ''} */\n"
            f"    (void)c;\n    return (uint64_t)({body});\n}}\n"
        )
        return name


def _divisors(e: mr.Expr) -> list[mr.Expr]:
    """Right-hand sides of every `/` and `%` in `e`, innermost first."""
    if not isinstance(e, mr.BinOp):
        return []
    out = _divisors(e.lhs) + _divisors(e.rhs)
    if e.op in ("/", "%"):
        out.append(e.rhs)
    return out


# ---- schedule: where barriers go ----


def _step(kernel: mr.Kernel, dirty: set[str]) -> tuple[bool, set[str]]:
    """One kernel as `RegionRunner.record` records it: (a barrier before it, buffers written
    since the last barrier after it).  Zeroing outputs ends with a barrier of its own."""
    if kernel.zero_outputs:
        dirty = set()
    touched = {b.buffer for b in kernel.bindings}
    barrier = bool(touched & dirty)
    if barrier:
        dirty = set()
    return barrier, dirty | {b.buffer for b in kernel.bindings if b.writes}


def _run(body: Sequence[mr.Kernel], dirty: set[str]) -> tuple[list[bool], set[str]]:
    flags = []
    for k in body:
        barrier, dirty = _step(k, dirty)
        flags.append(barrier)
    return flags, dirty


def schedule(kernels: Sequence[mr.Kernel]) -> list[tuple[bool, bool]]:
    """Per kernel of a product, in order: (barrier before its first run, barrier before a
    repeated run).  Consecutive kernels with one `loop` id run `loop_count` times
    (`RegionRunner._schedule`).  The dirty sets are followed through the loop until they come
    round again; after a loop, a barrier goes where any count (0 included) would need one, so
    a repeat that runs 0 times may cost one barrier the Python runtime does not place."""
    out: list[tuple[bool, bool]] = []
    dirty: set[str] = set()
    i = 0
    while i < len(kernels):
        loop = kernels[i].loop
        j = i + 1
        while loop is not None and j < len(kernels) and kernels[j].loop == loop:
            j += 1
        body = kernels[i:j]
        if loop is None:
            first, dirty = _step(body[0], dirty)
            out.append((first, first))
            i = j
            continue
        firsts, state = _run(body, dirty)
        possible = [frozenset(dirty), frozenset(state)]  # after 0 runs, after 1
        again = [False] * len(body)
        while True:  # run k + 1 depends only on the dirty set after run k: stop at a cycle
            flags, state = _run(body, state)
            again = [a or f for a, f in zip(again, flags, strict=True)]
            if frozenset(state) in possible[1:]:
                break
            possible.append(frozenset(state))
        out += list(zip(firsts, again, strict=True))
        dirty = set().union(*possible)
        i = j
    return out


# ---- the header ----


def _bitmask(sub: mr.Subgroup) -> int:
    mask = 0
    for bit, size in enumerate(_SUBGROUP_SIZES):
        kind, sizes = sub.kind, sub.sizes
        if (
            kind == "any"
            or (kind == "at_least" and size >= sizes[0])
            or (kind == "choice" and size in sizes)
        ):
            mask |= 1 << bit
    return mask


def _dtype(dtype: str) -> str:
    if dtype not in _DTYPES:
        raise _fail(f"fusec export does not know dtype '{dtype}' yet", "export another build")
    return "FUSEC_DTYPE_" + dtype.upper()


def _layout(dtype: str) -> tuple[int, int, int]:
    """(bytes per element, elements per block, bytes per block) of a buffer's storage
    (`codegen.manifest.storage_shape`): blocks for quantized dtypes, else elements."""
    if dtype in mf.QUANT_BLOCK_BYTES:
        return 0, mf.QUANT_BLOCK_ELEMS[dtype], mf.QUANT_BLOCK_BYTES[dtype]
    return (2 if dtype == "f16" else 4), 0, 0


def _spv_array(name: str, spv: bytes) -> str:
    words = struct.unpack(f"<{len(spv) // 4}I", spv)
    lines = [f"static const uint32_t {name}[{len(words)}] = {{"]
    for start in range(0, len(words), 8):
        chunk = ", ".join(f"0x{w:08x}u" for w in words[start : start + 8])
        lines.append(f"    {chunk},")
    lines.append("};\n")
    return "\n".join(lines)


_PRELUDE = r"""
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Types and helpers shared by every header fusec exports (defined once per translation unit). */
#ifndef FUSEC_HEADER_TYPES_1
#define FUSEC_HEADER_TYPES_1

typedef enum fusec_dtype {
    FUSEC_DTYPE_U32 = 0,
    FUSEC_DTYPE_I32 = 1,
    FUSEC_DTYPE_F32 = 2,
    FUSEC_DTYPE_F16 = 3,
    FUSEC_DTYPE_Q8_0 = 4,  /* GGUF blocks: 34 bytes per 32 elements */
    FUSEC_DTYPE_Q4_0 = 5,  /* GGUF blocks: 18 bytes per 32 elements */
    FUSEC_DTYPE_Q8_0X = 6, /* fusec's aligned q8_0 activations: 48 bytes per 32 elements */
    FUSEC_DTYPE_Q4_K = 7,  /* GGUF blocks: 144 bytes per 256 elements */
    FUSEC_DTYPE_Q6_K = 8   /* GGUF blocks: 210 bytes per 256 elements */
} fusec_dtype;

typedef enum fusec_buffer_kind {
    FUSEC_BUFFER_INPUT = 0,
    FUSEC_BUFFER_OUTPUT = 1,
    FUSEC_BUFFER_INTERMEDIATE = 2, /* only the unfused chain (or a split fused product) uses it */
    FUSEC_BUFFER_PARAMS = 3        /* run-time parameters: one 32-bit word per slot, host-
                                      written: a u32 param's value, an f32 param's bits
                                      (its fusec_value's .u) */
} fusec_buffer_kind;

typedef enum fusec_subgroup_kind {
    FUSEC_SUBGROUP_ANY = 0,
    FUSEC_SUBGROUP_AT_LEAST = 1,
    FUSEC_SUBGROUP_CHOICE = 2
} fusec_subgroup_kind;

/* Device features a kernel needs (fusec_kernel.features). */
#define FUSEC_FEATURE_STORAGE_BUFFER_16BIT 0x1u /* storageBuffer16BitAccess */
#define FUSEC_FEATURE_ATOMIC_FLOAT_ADD 0x2u     /* shaderBufferFloat32AtomicAdd */
#define FUSEC_FEATURE_INTEGER_DOT_PRODUCT 0x4u  /* shaderIntegerDotProduct */
#define FUSEC_FEATURE_VULKAN_MEMORY_MODEL 0x8u  /* vulkanMemoryModel (a kernel with counters) */
#define FUSEC_FEATURE_FLOAT64 0x10u             /* shaderFloat64 (a stage computed as f64) */

/* The value of one constant of a region, by its dtype: u32 -> u, i32 -> i, f32 -> f (the
   tables below initialize one by its 32 bits, through `u`, so C89-style C++ compiles them). */
typedef union fusec_value {
    uint32_t u;
    int32_t i;
    float f;
} fusec_value;

/* A size expression of the region's constants (`c` holds them in the region's order). */
typedef uint64_t (*fusec_expr_fn)(const fusec_value *c);

typedef struct fusec_const {
    const char *name;
    fusec_dtype dtype;        /* u32, i32 or f32 */
    uint32_t spec_id;         /* specialization constant id; a run-time parameter: its slot */
    int runtime;              /* 1: a run-time parameter (params buffer), not a spec constant */
    fusec_value default_value;
    int has_min, has_max;     /* the declared range `in MIN .. MAX`, where there is one */
    double min, max;
} fusec_const;

typedef struct fusec_buffer {
    const char *name;
    fusec_dtype dtype;
    fusec_buffer_kind kind;
    int state;                /* an output that keeps its contents between runs (a cache) */
    uint32_t item_bytes;      /* bytes per element; 0 for quantized blocks: */
    uint32_t block_elems;     /* elements per block of the last dimension (0: not blocks) */
    uint32_t block_bytes;     /* bytes per block; a last partial block takes a whole one */
    uint32_t rank;
    const char *shape_text[8];
    fusec_expr_fn shape[8];   /* elements per dimension */
    const char *packing;      /* NULL: GGUF bytes; "split": repack them before the upload, each
                                 block's parts stored apart (docs/ENGINE.md) */
} fusec_buffer;

typedef struct fusec_binding {
    uint32_t binding;         /* descriptor set 0, a storage buffer */
    const char *buffer;
    uint32_t buffer_index;    /* into fusec_region.buffers */
    int reads, writes;
} fusec_binding;

typedef struct fusec_spec {
    uint32_t id;              /* SPIR-V SpecId: 4 bytes each (u32, i32 or f32 bits) */
    const char *name;         /* the constant's name, or the expression of a derived one */
    fusec_dtype dtype;
    int32_t const_index;      /* into fusec_region.consts; -1: derived from the constants */
    fusec_expr_fn derived;    /* a derived constant's value (u32), else NULL */
    fusec_value default_value;/* at the region's default constants */
} fusec_spec;

typedef struct fusec_grid_item {
    const char *extent_text;
    fusec_expr_fn extent;     /* rows (or items) of one phase of the kernel */
    uint32_t per_workgroup;   /* items per workgroup, or 0: rows_per_subgroup per subgroup */
    uint32_t rows_per_subgroup;
} fusec_grid_item;

typedef struct fusec_kernel {
    const char *name;
    const uint32_t *spv;
    size_t spv_words;         /* codeSize = 4 * spv_words */
    const char *sha256;       /* of the SPIR-V bytes, as the manifest records it */
    const char *entry_point;  /* "main" */
    uint32_t local_size[3];
    fusec_subgroup_kind subgroup_kind;
    uint32_t subgroup_sizes;  /* bit b set: subgroup size 2^b runs the kernel */
    uint32_t required_subgroup_size; /* 0: any size runs it; else the least size it allows */
    uint32_t binding_count;
    const fusec_binding *bindings;
    uint32_t spec_count;
    const fusec_spec *specs;
    uint32_t push_constant_bytes; /* 0: fusec kernels take no push constants */
    uint32_t grid_count;
    const fusec_grid_item *grid;
    const char *workgroups_text;
    uint32_t (*workgroups)(const fusec_value *c, uint32_t subgroup_size);
    uint64_t (*shared_bytes)(const fusec_value *c);
    uint32_t features;        /* FUSEC_FEATURE_* */
    uint32_t zero_count;      /* outputs to fill with zeros (then a barrier) before it runs */
    const uint32_t *zero_outputs; /* buffer indices */
    int32_t loop;             /* -1; else consecutive kernels of one loop id run loop_count times */
    fusec_expr_fn loop_count;
    uint32_t counter_count;   /* arrival counters: zero them once when allocated, never poison */
    const uint32_t *counters; /* buffer indices; every dispatch leaves them at zero */
} fusec_kernel;

/* One kernel of a product in dispatch order.  A barrier before it means: compute-shader
   writes made available to later compute-shader reads and writes
   (VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT -> same, VK_ACCESS_SHADER_WRITE_BIT ->
   VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT). */
typedef struct fusec_step {
    const fusec_kernel *kernel;
    int barrier_before;        /* before its first run */
    int barrier_before_repeat; /* before each later run of its loop */
} fusec_step;

typedef struct fusec_region {
    const char *name;
    uint32_t const_count;
    const fusec_const *consts;
    const fusec_value *defaults;
    uint32_t buffer_count;     /* inputs, then outputs, intermediates, the params buffer */
    const fusec_buffer *buffers;
    uint32_t fused_count;
    const fusec_step *fused;
    uint32_t fused_shared_count; /* 0, or the fused product exchanging through shared memory */
    const fusec_step *fused_shared;
    uint32_t unfused_count;
    const fusec_step *unfused;
    /* NULL when the region runs at these constants, else why not (a sentence) */
    const char *(*check)(const fusec_value *c);
} fusec_region;

static inline uint64_t fusec_div64(uint64_t a, uint64_t b) { return b ? a / b : 0u; }
static inline uint64_t fusec_mod64(uint64_t a, uint64_t b) { return b ? a % b : 0u; }
static inline uint32_t fusec_div32(uint32_t a, uint32_t b) { return b ? a / b : 0u; }
static inline uint32_t fusec_mod32(uint32_t a, uint32_t b) { return b ? a % b : 0u; }
static inline uint64_t fusec_max64(uint64_t a, uint64_t b) { return a > b ? a : b; }
static inline uint64_t fusec_ceil64(uint64_t a, uint64_t b)
{
    return b ? a / b + (a % b != 0u) : 0u;
}

/* Bytes of a buffer at constants `c` (before rounding up to a multiple of 4). */
static inline uint64_t fusec_buffer_bytes(const fusec_buffer *b, const fusec_value *c)
{
    uint64_t n = 1;
    uint32_t d;
    for (d = 0; d < b->rank; ++d) {
        uint64_t extent = b->shape[d](c);
        if (b->block_elems && d + 1 == b->rank)
            extent = (extent + b->block_elems - 1u) / b->block_elems * b->block_bytes;
        n *= extent;
    }
    return b->block_elems ? n : n * b->item_bytes;
}

/* The subgroup size the kernel runs at, chosen as fusec's runtime chooses it: the device's
   default when the kernel allows it, else (with subgroup size control) the largest allowed
   size from min to max; 0 when the device cannot run it. */
static inline uint32_t fusec_subgroup_size(const fusec_kernel *k, uint32_t device_default,
                                           uint32_t min_size, uint32_t max_size,
                                           int size_control)
{
    uint32_t s, best = 0, bit;
    for (bit = 0; bit < 8; ++bit)
        if ((k->subgroup_sizes >> bit & 1u) && (1u << bit) == device_default) return device_default;
    if (!size_control) return 0;
    for (s = min_size ? min_size : 1; s && s <= max_size && s <= 128; s *= 2)
        for (bit = 0; bit < 8; ++bit)
            if ((k->subgroup_sizes >> bit & 1u) && (1u << bit) == s) best = s;
    return best;
}

/* The specialization data of a kernel at constants `c`: spec_count 32-bit words, word i for
   k->specs[i] (map entry: constantID specs[i].id, offset 4 * i, size 4). */
static inline void fusec_spec_words(const fusec_kernel *k, const fusec_value *c, uint32_t *words)
{
    uint32_t i;
    for (i = 0; i < k->spec_count; ++i) {
        const fusec_spec *s = &k->specs[i];
        if (s->const_index >= 0)
            memcpy(&words[i], &c[s->const_index], 4);
        else
            words[i] = (uint32_t)s->derived(c);
    }
}

/* The index of constant `name` in region `r`, or -1. */
static inline int fusec_find_const(const fusec_region *r, const char *name)
{
    uint32_t i;
    for (i = 0; i < r->const_count; ++i)
        if (strcmp(r->consts[i].name, name) == 0) return (int)i;
    return -1;
}

#endif /* FUSEC_HEADER_TYPES_1 */
"""


class _Writer:
    """Builds the header's text for the selected regions of one validated manifest."""

    def __init__(self, data: mr.Manifest, modules: Mapping[str, bytes], prefix: str) -> None:
        self.data = data
        self.modules = modules
        self.p = prefix  # of every name this build defines (the shared types keep `fusec_`)
        self.exprs = _Exprs(prefix)
        self.region_names = _Names()
        self.kernel_names = _Names()
        self.parts: list[str] = []

    def region(self, region: mr.Region) -> str:
        rid = self.region_names.make(region.name)
        consts = region.consts
        index = {c.name: i for i, c in enumerate(consts)}
        dtypes = {c.name: c.dtype for c in consts}
        out: list[str] = [f"/* ==== region {c_comment(region.name)} ==== */\n"]

        # constants
        rows = []
        defaults = []
        for c in consts:
            default = self._value(c.dtype, c.default)
            defaults.append(default)
            lo, hi = c.lo, c.hi
            rows.append(
                f"    {{{c_string(c.name)}, {_dtype(c.dtype)}, {c.spec_id}u, "
                f"{int(c.runtime)}, {default}, {int(lo is not None)}, {int(hi is not None)}, "
                f"{_double_literal(lo or 0)}, {_double_literal(hi or 0)}}},"
            )
        n_consts = max(1, len(consts))
        out.append(f"static const fusec_const {self.p}_consts_{rid}[{n_consts}] = {{")
        out += rows or ["    {0, FUSEC_DTYPE_U32, 0u, 0, {0u}, 0, 0, 0.0, 0.0},"]
        out.append("};")
        out.append(f"static const fusec_value {self.p}_defaults_{rid}[{n_consts}] = {{")
        out += [f"    {d}," for d in defaults] or ["    {0u},"]
        out.append("};\n")

        # buffers
        buffers = [(b, "input") for b in region.inputs]
        buffers += [(b, "output") for b in region.outputs]
        buffers += [(b, "intermediate") for b in region.intermediates]
        params = sorted((c for c in consts if c.runtime), key=lambda c: c.spec_id)
        if params:
            buffers.append((mr.Buffer(PARAMS_BUFFER, "u32", (len(params),)), "params"))
        buffer_index = {b.name: i for i, (b, _) in enumerate(buffers)}
        rows = []
        for b, kind in buffers:
            texts = [c_string(mf.format_expr(d)) for d in b.shape]
            fns = [self.exprs.function(d, index, dtypes) for d in b.shape]
            rank = len(b.shape)
            item, block, block_bytes = _layout(b.dtype)
            rows.append(
                f"    {{{c_string(b.name)}, {_dtype(b.dtype)}, "
                f"FUSEC_BUFFER_{kind.upper()}, {int(b.state)}, "
                f"{item}u, {block}u, {block_bytes}u, {rank}u, "
                f"{{{', '.join(texts) or '0'}}}, {{{', '.join(fns) or '0'}}}, "
                f"{c_string(b.packing.layout) if b.packing is not None else '0'}}},"
            )
        out.append(f"static const fusec_buffer {self.p}_buffers_{rid}[{len(buffers)}] = {{")
        out += rows
        out.append("};\n")

        # kernels and products
        kernel_ids: dict[str, str] = {}
        for k in region.kernels():
            kernel_ids[k.name] = self.kernel(k, region, index, dtypes, buffer_index, out)
        counts = {}
        products = {"fused": region.fused, "fused_shared": region.fused_shared}
        products["unfused"] = region.unfused
        for product in _PRODUCTS:
            kernels = products[product]
            counts[product] = len(kernels)
            if not kernels:
                continue
            flags = schedule(kernels)
            out.append(
                f"static const fusec_step {self.p}_{product.replace('_', '')}_{rid}"
                f"[{len(kernels)}] = {{"
            )
            for k, (first, again) in zip(kernels, flags, strict=True):
                out.append(
                    f"    {{&{self.p}_kernel_{kernel_ids[k.name]}, {int(first)}, {int(again)}}},"
                )
            out.append("};")
        out.append("")

        out.append(self._check(region, rid, index, dtypes))
        shared = f"{self.p}_fusedshared_{rid}" if counts["fused_shared"] else "0"
        out.append(f"static const fusec_region {self.p}_region_{rid} = {{")
        out.append(f"    {c_string(region.name)},")
        out.append(f"    {len(consts)}u, {self.p}_consts_{rid}, {self.p}_defaults_{rid},")
        out.append(f"    {len(buffers)}u, {self.p}_buffers_{rid},")
        out.append(f"    {counts['fused']}u, {self.p}_fused_{rid},")
        out.append(f"    {counts['fused_shared']}u, {shared},")
        out.append(f"    {counts['unfused']}u, {self.p}_unfused_{rid},")
        out.append(f"    {self.p}_check_{rid}")
        out.append("};\n")
        self.parts.append("\n".join(out))
        return rid

    @staticmethod
    def _value(dtype: str, v: float) -> str:
        """A fusec_value initializer: the 32 bits, through the first member (C89 and C++
        initialize a union that way), with the value in a comment."""
        if dtype == "f32":
            bits = struct.unpack("<I", struct.pack("<f", v))[0]
            return f"{{0x{bits:08x}u}} /* {_f32_literal(v)} */"
        if dtype == "i32":
            return f"{{0x{int(v) & 0xFFFFFFFF:08x}u}} /* {int(v)} */"
        return f"{{{int(v)}u}}"

    def kernel(
        self,
        k: mr.Kernel,
        region: mr.Region,
        index: Mapping[str, int],
        dtypes: Mapping[str, str],
        buffer_index: Mapping[str, int],
        out: list[str],
    ) -> str:
        kid = self.kernel_names.make(k.name)
        spv = self.modules[k.name]
        if len(spv) % 4:
            raise _fail(f"{k.spv} is not a whole number of 32-bit words")
        out.append(f"/* kernel {c_comment(k.name)}: stages {c_comment(', '.join(k.stages))} */")
        out.append(_spv_array(f"{self.p}_spv_{kid}", spv))

        out.append(f"static const fusec_binding {self.p}_bindings_{kid}[{len(k.bindings)}] = {{")
        for b in sorted(k.bindings, key=lambda b: b.binding):
            out.append(
                f"    {{{b.binding}u, {c_string(b.buffer)}, {buffer_index[b.buffer]}u, "
                f"{int(b.reads)}, {int(b.writes)}}},"
            )
        out.append("};")

        specs = []
        defaults = {c.name: c.default for c in region.consts}
        for i, c in enumerate(region.consts):
            if not c.runtime:
                value = self._value(c.dtype, c.default)
                specs.append(
                    f"    {{{c.spec_id}u, {c_string(c.name)}, {_dtype(c.dtype)}, {i}, 0, {value}}},"
                )
        for d in k.derived:
            fn = self.exprs.function(d.expr, index, dtypes, wrap32=True)
            try:
                default = mf.eval_u32(d.expr, defaults)
            except ValueError:
                default = 0  # the region's check refuses these constants
            specs.append(
                f"    {{{d.spec_id}u, {c_string(mf.format_expr(d.expr))}, "
                f"FUSEC_DTYPE_U32, -1, {fn}, {{{default}u}}}},"
            )
        out.append(f"static const fusec_spec {self.p}_specs_{kid}[{max(1, len(specs))}] = {{")
        out += specs or ["    {0u, 0, FUSEC_DTYPE_U32, -1, 0, {0u}},"]
        out.append("};")

        grid_rows, terms = [], []
        wg = int(k.workgroup_size)
        for g in k.grid:
            fn = self.exprs.function(g.extent, index, dtypes)
            text = mf.format_expr(g.extent)
            grid_rows.append(
                f"    {{{c_string(text)}, {fn}, {g.per_workgroup or 0}u, "
                f"{g.rows_per_subgroup or 0}u}},"
            )
            if g.per_workgroup is not None:
                per = f"{g.per_workgroup}u"
                per_text = str(g.per_workgroup)
            else:
                rows = g.rows_per_subgroup
                per = f"{rows}u * fusec_max64(1u, {wg}u / subgroup_size)"
                per_text = f"{rows} * max(1, {wg} / subgroup_size)"
            terms.append((f"fusec_ceil64({fn}(c), {per})", f"ceil({text} / ({per_text}))"))
        out.append(
            f"static const fusec_grid_item {self.p}_grids_{kid}[{max(1, len(grid_rows))}] = {{"
        )
        out += grid_rows or ["    {0, 0, 0u, 0u},"]
        out.append("};")
        groups_text = "min(65535, max(1, " + ", ".join(t for _, t in terms) + "))"
        out.append(
            f"static inline uint32_t {self.p}_groups_{kid}(const fusec_value *c, "
            f"uint32_t subgroup_size)\n{{ /* {c_comment(groups_text)} */\n"
            f"    uint64_t groups = 1u;\n    (void)c;\n"
            f"    if (subgroup_size == 0u) subgroup_size = 1u;"
        )
        for code, _ in terms:
            out.append(f"    groups = fusec_max64(groups, {code});")
        out.append("    return (uint32_t)(groups < 65535u ? groups : 65535u);\n}")

        shared_terms = [f"4u * {self.exprs.function(e, index, dtypes)}(c)" for e in k.shared_floats]
        scratch = 4 * wg * (int(k.reduction_scratch) + int(k.exchange_scratch))
        scratch += 4 if k.counters else 0  # s_last (kir.Arrive)
        out.append(
            f"static inline uint64_t {self.p}_shmem_{kid}(const fusec_value *c)\n"
            f"{{\n    (void)c;\n    return {' + '.join([*shared_terms, f'{scratch}u'])};\n}}"
        )
        zero = [f"{buffer_index[z]}u" for z in k.zero_outputs]
        out.append(
            f"static const uint32_t {self.p}_zeros_{kid}[{max(1, len(zero))}] = "
            f"{{{', '.join(zero) or '0u'}}};"
        )
        counters = [f"{buffer_index[z]}u" for z in k.counters]
        out.append(
            f"static const uint32_t {self.p}_counters_{kid}[{max(1, len(counters))}] = "
            f"{{{', '.join(counters) or '0u'}}};"
        )
        loop_fn = (
            self.exprs.function(k.loop_count, index, dtypes) if k.loop_count is not None else "0"
        )
        for f in k.features:
            if f not in _FEATURES:
                raise _fail(f"fusec export does not know device feature '{f}' yet")
        features = " | ".join(f"FUSEC_FEATURE_{f.upper()}" for f in k.features) or "0u"
        sub = k.subgroup
        required = 0 if sub.kind == "any" else min(sub.sizes)
        out.append(f"static const fusec_kernel {self.p}_kernel_{kid} = {{")
        out.append(f"    {c_string(k.name)},")
        out.append(f'    {self.p}_spv_{kid}, {len(spv) // 4}u, {c_string(k.sha256)}, "main",')
        out.append(f"    {{{wg}u, 1u, 1u}},")
        out.append(f"    FUSEC_SUBGROUP_{sub.kind.upper()}, 0x{_bitmask(sub):02x}u, {required}u,")
        out.append(f"    {len(k.bindings)}u, {self.p}_bindings_{kid},")
        out.append(f"    {len(specs)}u, {self.p}_specs_{kid},")
        out.append("    0u,")
        out.append(f"    {len(grid_rows)}u, {self.p}_grids_{kid},")
        out.append(f"    {c_string(groups_text)}, {self.p}_groups_{kid},")
        out.append(f"    {self.p}_shmem_{kid},")
        out.append(f"    {features},")
        out.append(f"    {len(zero)}u, {self.p}_zeros_{kid},")
        loop = -1 if k.loop is None else int(k.loop)
        out.append(f"    {loop}, {loop_fn},")
        out.append(f"    {len(counters)}u, {self.p}_counters_{kid}")
        out.append("};\n")
        return kid

    def _check(
        self,
        region: mr.Region,
        rid: str,
        index: Mapping[str, int],
        dtypes: Mapping[str, str],
    ) -> str:
        """`fusec_check_<region>`: the refusals of `runtime.dispatch.const_values` and
        `check_runnable` that need no device, as C: values outside their declared range or
        not finite, a zero divisor in a size expression, a size past 2^32 - 1, rows of
        quantized weights that are not whole blocks, a state write past its buffer."""
        lines = [f"static inline const char *{self.p}_check_{rid}(const fusec_value *c)\n{{"]
        lines.append("    (void)c;")
        for i, c in enumerate(region.consts):
            field = {"u32": "u", "i32": "i", "f32": "f"}[c.dtype]
            name = c.name
            if field == "f":
                lines.append(
                    f"    if (!(c[{i}].f == c[{i}].f) || c[{i}].f > 3.4028234663852886e38f || "
                    f"c[{i}].f < -3.4028234663852886e38f)\n"
                    f"        return {c_string(f'constant {name!r} must be a finite number')};"
                )
            for bound, op in ((c.lo, "<"), (c.hi, ">")):
                if bound is None:
                    continue
                limit = _double_literal(bound)
                rng = f"{c.lo} .. {c.hi}"
                lines.append(
                    f"    if ((double)c[{i}].{field} {op} {limit})\n"
                    f"        return {c_string(f'constant {name!r} is outside its range {rng}')};"
                )
        seen: set[str] = set()
        checked: list[str] = []
        for e in mf.region_expressions(region):
            text = mf.format_expr(e)
            if text in seen:
                continue
            seen.add(text)
            for d in _divisors(e):
                fn = self.exprs.function(d, index, dtypes)
                if fn in checked:
                    continue
                checked.append(fn)
                msg = f"{text} divides by zero"
                lines.append(f"    if ({fn}(c) == 0u) return {c_string(msg)};")
            fn = self.exprs.function(e, index, dtypes)
            msg = f"{text} is outside 0 .. 2^32 - 1"
            lines.append(f"    if ({fn}(c) >= 4294967296u) return {c_string(msg)};")
        for k in region.kernels():
            for derived in k.derived:
                for div in _divisors(derived.expr):
                    fn = self.exprs.function(div, index, dtypes, wrap32=True)
                    math = mf.format_expr(derived.expr)
                    msg = f"kernel {k.name}'s index math {math} divides by zero"
                    lines.append(f"    if ({fn}(c) == 0u) return {c_string(msg)};")
            if k.loop_count is not None:
                fn = self.exprs.function(k.loop_count, index, dtypes)
                msg = f"kernel {k.name} would repeat more than {mf.MAX_LOOP_COUNT} times"
                lines.append(f"    if ({fn}(c) > {mf.MAX_LOOP_COUNT}u) return {c_string(msg)};")
        for b in (*region.inputs, *region.outputs):  # a q8_0x output is blocks too
            if b.dtype in mf.QUANT_BLOCK_BYTES and b.shape:
                fn = self.exprs.function(b.shape[-1], index, dtypes)
                elems = _layout(b.dtype)[1]
                noun = block_noun(b.dtype)
                msg = f"{b.dtype} {noun} {b.name!r} needs rows of whole {elems}-element blocks"
                lines.append(f"    if ({fn}(c) % {elems}u != 0u) return {c_string(msg)};")
        for w in region.state_writes:
            buf = next(b for b in region.outputs if b.name == w.buffer)
            fn = self.exprs.function(buf.shape[w.axis], index, dtypes)
            at = index[w.at]
            msg = f"{w.at!r} is past the end of {w.buffer!r}"
            lines.append(f"    if ((uint64_t)c[{at}].u >= {fn}(c)) return {c_string(msg)};")
        lines.append("    return 0;\n}\n")
        return "\n".join(lines)


PREFIX = "fusec"  # the default prefix of the names a header defines
_PREFIX_RE = re.compile(r"[a-z][a-z0-9]{0,30}")


def check_prefix(prefix: str) -> str:
    """`prefix` when it can begin the header's C names (lower-case letters and digits, a
    letter first, at most 31), else DiagnosticError in one sentence."""
    if not _PREFIX_RE.fullmatch(prefix):
        raise DiagnosticError(
            [
                Diagnostic(
                    None,
                    f"--prefix {prefix!r} is not a prefix of C names",
                    "use lower-case letters and digits, a letter first, at most 31 (e.g. qwen)",
                )
            ]
        )
    return prefix


def emit_header(
    data: mr.Manifest,
    modules: Mapping[str, bytes],
    regions: Iterable[str] | None = None,
    prefix: str = PREFIX,
) -> str:
    """The C header for a validated manifest and its modules (kernel name -> SPIR-V bytes),
    for `regions` (all by default, in manifest order).  Every name it defines begins with
    `prefix` (`<prefix>_regions`, `<prefix>_region_<r>`, ...), so that headers of two builds,
    exported with two prefixes, can be included in one file; the types and helpers they share
    keep `fusec_`, behind a guard of their own."""
    chosen = set(regions) if regions is not None else None
    writer = _Writer(data, modules, check_prefix(prefix))
    region_ids = [writer.region(r) for r in data.regions if chosen is None or r.name in chosen]
    # one guard per build, selection of regions and prefix: the same header included twice is
    # read once
    key = "\0".join([data.integrity, prefix, *(r for r in (regions or ()))])
    guard = f"FUSEC_HEADER_{hashlib.sha256(key.encode()).hexdigest()[:16].upper()}_H"
    # two different headers of one prefix would define the same names: say so, not a C error
    taken = f"FUSEC_PREFIX_{prefix.upper()}_TAKEN"
    clash = [
        f"#ifdef {taken}",
        f'#error "two fusec headers with the prefix {prefix} in one file: export one of them '
        'again with fusec export --prefix NAME"',
        "#endif",
        f"#define {taken} 1",
    ]
    source = Path(data.source).name
    head = [
        MARKER,
        f"/* format {HEADER_FORMAT}; from a build of {c_comment(source)}",
        f" * manifest {data.format}, integrity {data.integrity}",
        f" * compiler {c_comment(data.compiler)}",
        " *",
        " * Plain C99.  Every kernel's SPIR-V, its bindings (descriptor set 0, storage buffers),",
        " * specialization constants, local size, subgroup sizes, shared memory and grid, and per",
        " * region the fused product and the unfused chain in dispatch order with their barriers.",
        " * Sizes are functions of the region's constants (fusec_value c[], in the order of",
        " * fusec_region.consts); call the region's check() on new constants first.",
        " * docs/ENGINE.md in the fusec repository describes it. */",
        f"#ifndef {guard}",
        f"#define {guard}",
        *clash,
        _PRELUDE,
    ]
    body = "\n".join(writer.parts)
    table = [
        "/* the regions of this header, in manifest order */",
        f"static const fusec_region *const {prefix}_regions[{max(1, len(region_ids))}] = {{",
        *([f"    &{prefix}_region_{rid}," for rid in region_ids] or ["    0,"]),
        "};",
        f"static const uint32_t {prefix}_regions_count = {len(region_ids)}u;",
        "",
        f"#endif /* {guard} */",
        "",
    ]
    return "\n".join([*head, *writer.exprs.defs, body, *table])
