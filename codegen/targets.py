"""Targets by name, as frozen records with their occupancy model; passes read fields, not names.

Sources (FACTS.md): Mesa 25.0 `radv_get_max_waves` and ACO for RDNA, LLVM AMDGPU's register
file sizes, CUDA's occupancy calculation for Hopper.  Formulas:

RDNA, per SIMD, wave size W, VGPR file P per lane, allocation granule G:
    alloc      = max(G, align_up(vgprs, G))            (at most 256)
    waves_vgpr = min(max_waves, floor(P / alloc))
    waves_lds  = ceil(floor(lds_per_wgp / align_up(lds_bytes, 1024)) * waves_per_wg / 4)
    ACO spills iff demand > min(256, floor((P / ceil(waves_per_wg / 4)) / G) * G)
Hopper, per SM (reported per scheduler, i.e. divided by 4, to compare with a SIMD):
    regs_warp = ceil(regs * 32 / 256) * 256
    blocks    = min(floor(floor(65536 / regs_warp) / warps_per_cta) ... , 64 / warps_per_cta, 32,
                    floor(smem_per_sm / smem_per_cta))

Capabilities: what a fused kernel may need beyond registers (the manifest's kernel `features`,
its subgroup requirement, shared memory, workgroup size), as each target's Vulkan driver reports
it.  The gate refuses a fusion whose fused kernel needs one its target lacks
(`budget.capability_refusal`).  Sources, per target, beside TARGETS.
"""

from __future__ import annotations

import math

import attrs


@attrs.frozen
class CodeKnobs:
    """What the scheduling plan (codegen/plan.py) reads of a target: how much a contraction step
    keeps in flight and how wide one load is.  `plan_kernel(kernel, knobs)` turns them into the
    decisions the GLSL printer renders; nothing else reads them."""

    # wide loads of f16/f32 rows a lane keeps in flight per unrolled contraction step
    loads_in_flight: int
    # 32-bit words of GGUF weight blocks a lane loads per unrolled integer dot product step
    int_dot_words: int
    # the most steps of a contraction unrolled into one iteration (either path)
    max_unroll: int
    # the widest single load of a buffer, in bytes (a uvec4 view: 16)
    max_load_bytes: int
    # a loop of one lane over an index (a lane reduction, a tile's `repeat`) is unrolled when
    # its trip count is a literal of at most this, and marked [[dont_unroll]] otherwise
    serial_unroll: int


# The code profile every build renders today: one SPIR-V module per kernel serves every target,
# so one knob set decides its code.  Its values were tuned on the H200 (sm90):
# - loads_in_flight 8: f16/f32 contraction steps unrolled until a lane has about 8 wide loads
#   (128 bytes) in flight; the layer's QKV projection 27.7 -> 18.3 us with the unroll hints
#   (docs/BENCHMARKS.md, "Unrolled contraction steps"); one 4096-wide matvec keeps only
#   2 x 16 bytes per lane otherwise, and loads in flight per lane decide HBM throughput on the
#   H200 (FACTS.md, the rows-per-subgroup sweep: 911 -> 3798 GB/s from 1 to 2 rows).
# - int_dot_words 40: chosen with the integer dot product path (commit 64bc050, issue 4).  Its
#   steps are unrolled by 4 for one row of q4_0 (5 words a block) and by 2 for two rows of
#   q8_0 (9 words).  GGUF steps that dequantize to f32 are not unrolled at all: unrolled, q4_0
#   ran 3-4x slower (spills; docs/BENCHMARKS.md).
# - max_unroll 4: the cap that came with loads_in_flight (same sweep).
#   Swept together on the H200 (2026-12-02, the Qwen3-8B layer, docs/BENCHMARKS.md "Unroll
#   knobs"): more blocks in flight (max_unroll 8 with int_dot_words 40 or 80) made q4_0 1-4 us
#   slower (its FFN 20.5 -> 23.25 at 8 blocks; q8_0's projection spilled); fewer (20 words,
#   or max_unroll 2) changed q4_0 and q8_0 by 0.25 us or less; loads_in_flight 4 or 16 and
#   max_unroll 2 or 8 made f16 1.5-5.5 us slower.  These values stay.
# - max_load_bytes 16: a uvec4 view of the buffer, the widest load GLSL gives; one LDG.128 on
#   Hopper and one buffer_load_dwordx4 / global_load_b128 on RDNA.
# - serial_unroll 8: stated so that the driver does not decide from the specialized trip count:
#   RADV unrolls up to 128 iterations of a loop that loads (Mesa `nir_opt_loop_unroll.c`,
#   `check_unrolling_restrictions`; RADV's `max_unroll_iterations_aggressive` 128), after which
#   its value numbering and reassociation keep every iteration's load live (ACO, 131 VGPRs for
#   two lane sums over 128 rows, against 4 in a loop).  Stated, the register demand is what
#   codegen/liveness.py measures on our SPIR-V, for every value of the constants.
CODE_PROFILE = CodeKnobs(
    loads_in_flight=8, int_dot_words=40, max_unroll=4, max_load_bytes=16, serial_unroll=8
)


@attrs.frozen
class Target:
    name: str
    description: str
    vendor: str  # "amd" | "nvidia"
    wave_sizes: tuple[int, ...]
    vgpr_file: dict[int, int]  # per lane, by wave size (P)
    vgpr_granule: dict[int, int]  # allocation granule, by wave size (G)
    max_vgprs: int  # per lane
    max_waves_per_simd: int
    lds_per_wgp_bytes: int
    max_shared_bytes: int  # per workgroup, as Vulkan exposes it
    min_waves_default: int  # the default budget: at least this many waves per SIMD
    lds_granule: int = 1  # LDS is allocated in these units (RDNA: 512 bytes, as ACO reports)
    # Capabilities.  `wave_sizes` above are also the subgroup sizes a compute kernel can be given
    # (min..max, requiredSubgroupSize), and `max_shared_bytes` is maxComputeSharedMemorySize.
    arch: str = ""  # the family, as messages name it ("RDNA2")
    features: frozenset[str] = frozenset()  # the FEATURES the driver offers
    size_control: bool = True  # subgroupSizeControl with the compute stage in requiredStages
    max_workgroup_size: int = 1024  # maxComputeWorkGroupInvocations
    # a dot product of a signed and an unsigned 4 x 8-bit vector is one instruction (RDNA3's
    # V_DOT4_I32_IU8; Mesa `has_sudot_4x8` from GFX11).  RDNA2 has only the same-signedness
    # V_DOT4_I32_I8 and V_DOT4_U32_U8, so Mesa lowers OpSUDot to byte multiplies there, and the
    # demand is the one with the signed operand unpacked (codegen/liveness.py rule 13)
    mixed_dot: bool = True
    # The scheduling plan's knobs for code built for this target alone (`plan_kernel(kernel,
    # target.knobs)`).  A build renders every kernel with CODE_PROFILE today (one SPIR-V module
    # for all targets); a per-target build would read these.
    knobs: CodeKnobs = CODE_PROFILE


# Manifest kernel features (codegen/build.py `features`) and their words in a refusal, with the
# Vulkan feature that grants each.
STORAGE_16BIT = "storage_buffer_16bit"  # storageBuffer16BitAccess
ATOMIC_FLOAT_ADD = "atomic_float_add"  # shaderBufferFloat32AtomicAdd (VK_EXT_shader_atomic_float)
INTEGER_DOT_PRODUCT = "integer_dot_product"  # shaderIntegerDotProduct (Vulkan 1.3)
FLOAT64 = "float64"  # shaderFloat64 (a stage computed `as f64`)
# vulkanMemoryModel (Vulkan 1.2): a kernel with stages in grid (kir.Arrive).  Every AMD target's
# RADV null device reports it (the query below, 2026-12-02, Mesa 25.0.7); sm90 is taken to have
# it (NVIDIA's Vulkan 1.2+ drivers expose it; not read on the H200 yet), and the runtime checks
# the device itself before it runs such a kernel (dispatch.feature_refusal).
MEMORY_MODEL = "vulkan_memory_model"
FEATURES: dict[str, str] = {
    STORAGE_16BIT: "16-bit storage buffers",
    ATOMIC_FLOAT_ADD: "float atomic add on buffers",
    INTEGER_DOT_PRODUCT: "integer dot products",
    FLOAT64: "double-precision arithmetic",
    MEMORY_MODEL: "the Vulkan memory model",
}


def _rdna(
    name: str,
    description: str,
    p32: int,
    g32: int,
    arch: str,
    features: frozenset[str],
    mixed_dot: bool = True,
) -> Target:
    return Target(
        name=name,
        description=description,
        vendor="amd",
        wave_sizes=(32, 64),
        vgpr_file={32: p32, 64: p32 // 2},
        vgpr_granule={32: g32, 64: g32 // 2},
        max_vgprs=256,
        max_waves_per_simd=16,
        lds_per_wgp_bytes=131072,
        max_shared_bytes=65536,
        min_waves_default=4,
        lds_granule=512,
        arch=arch,
        features=features,
        size_control=True,
        max_workgroup_size=1024,
        mixed_dot=mixed_dot,
        # Not measured on any RDNA part: the H200's profile until `fusec tune` (issue 18) times
        # the knobs there.  RDNA's widest load is 16 bytes too (global_load_b128).
        knobs=CODE_PROFILE,
    )


_ALL_FEATURES = frozenset(FEATURES)

# Capabilities of the AMD targets, read from RADV's null device (Mesa 25.0.7, driverVersion
# 0x6400007): `RADV_FORCE_FAMILY=<name> VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/radeon_icd.json`,
# vkGetPhysicalDeviceFeatures2 with VkPhysicalDevice16BitStorageFeatures,
# VkPhysicalDeviceShaderAtomicFloatFeaturesEXT and VkPhysicalDeviceShaderIntegerDotProductFeatures,
# and vkGetPhysicalDeviceProperties2 with VkPhysicalDeviceSubgroupSizeControlProperties (vulkaninfo
# segfaults under the null device, so a small `vulkan` query did it; 2026-12).  Every family
# reports storageBuffer16BitAccess, shaderIntegerDotProduct, subgroup sizes 32..64 with
# requiredSubgroupSize for compute, maxComputeSharedMemorySize 65536 and
# maxComputeWorkGroupInvocations 1024, and shaderFloat64 (vkGetPhysicalDeviceFeatures).
# shaderBufferFloat32AtomicAdd is true on gfx1201, gfx1200,
# gfx1151 and navi31 and false on navi21: RDNA2 has no buffer_atomic_add_f32, and ACO aborts
# with `Unsupported opcode` when a kernel uses it (FACTS.md).
_RDNA2_FEATURES = _ALL_FEATURES - {ATOMIC_FLOAT_ADD}


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        _rdna("gfx1201", "RDNA4 (RX 9070 XT)", 1536, 24, "RDNA4", _ALL_FEATURES),
        _rdna("gfx1200", "RDNA4 (RX 9060 XT)", 1536, 24, "RDNA4", _ALL_FEATURES),
        _rdna("gfx1151", "RDNA3.5 (Strix Halo)", 1536, 24, "RDNA3.5", _ALL_FEATURES),
        _rdna("navi31", "RDNA3 (RX 7900 XTX)", 1536, 24, "RDNA3", _ALL_FEATURES),
        _rdna("navi21", "RDNA2 (RX 6900 XT)", 1024, 16, "RDNA2", _RDNA2_FEATURES, False),
        Target(
            name="sm90",
            description="Hopper (H100/H200) through Vulkan",
            vendor="nvidia",
            wave_sizes=(32,),
            vgpr_file={32: 65536 // 4 // 32},  # registers per lane per scheduler (one quarter)
            vgpr_granule={32: 8},  # 256 registers per warp
            max_vgprs=255,
            max_waves_per_simd=16,  # 64 warps per SM over 4 schedulers
            lds_per_wgp_bytes=233472,  # 228 KiB shared per SM
            max_shared_bytes=49152,
            min_waves_default=4,
            # The NVIDIA driver on the lent H200 (580.159.4, driverVersion 0x9127c100; FACTS.md,
            # GPU.md), read with the same `vulkan` query as the AMD targets (2026-12-01):
            # storageBuffer16BitAccess, shaderBufferFloat32AtomicAdd, shaderIntegerDotProduct,
            # shaderFloat64, subgroup size 32..32 with requiredSubgroupSize for compute,
            # maxComputeSharedMemorySize 49152, maxComputeWorkGroupInvocations 1024.
            arch="Hopper",
            features=_ALL_FEATURES,
            size_control=True,
            max_workgroup_size=1024,
            knobs=CODE_PROFILE,  # tuned on this H200 (CODE_PROFILE's sources)
        ),
    )
}


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def waves_per_workgroup(workgroup_size: int, wave: int) -> int:
    return math.ceil(workgroup_size / wave)


def spill_limit(t: Target, wave: int, workgroup_size: int) -> int:
    """The most registers a lane may use before the compiler spills (FACTS.md for ACO)."""
    if t.vendor == "nvidia":
        return t.max_vgprs
    g = t.vgpr_granule[wave]
    per_simd = math.ceil(waves_per_workgroup(workgroup_size, wave) / 4)
    return min(t.max_vgprs, (t.vgpr_file[wave] // per_simd) // g * g)


def occupancy(t: Target, wave: int, vgprs: int, lds_bytes: int, workgroup_size: int) -> int:
    """Waves per SIMD (RDNA) or warps per scheduler (Hopper) for one kernel."""
    wpw = waves_per_workgroup(workgroup_size, wave)
    if t.vendor == "nvidia":
        regs_warp = align_up(max(vgprs, 1) * 32, 256)
        blocks = min((65536 // regs_warp) // wpw, 64 // wpw, 32)
        if lds_bytes:
            blocks = min(blocks, t.lds_per_wgp_bytes // align_up(lds_bytes, 1024))
        return min(t.max_waves_per_simd, blocks * wpw // 4)
    g = t.vgpr_granule[wave]
    alloc = max(g, align_up(vgprs, g))
    waves = min(t.max_waves_per_simd, t.vgpr_file[wave] // alloc)
    if lds_bytes:
        groups = t.lds_per_wgp_bytes // align_up(lds_bytes, 1024)
        waves = min(waves, math.ceil(groups * wpw / 4))
    return waves


def target_for_device(name: str) -> Target | None:
    """The target a Vulkan device is, from its name (None for CPUs and unknown GPUs)."""
    low = name.lower()
    if "h100" in low or "h200" in low or "gh200" in low:
        return TARGETS["sm90"]
    for t in TARGETS.values():
        if t.vendor == "amd" and t.name in low:
            return t
    return None
