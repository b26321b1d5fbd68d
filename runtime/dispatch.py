"""Running a region's product (fused kernels or the unfused chain) from a build folder.

Loads SPIR-V + manifest (no compiler needed), allocates buffers, records the kernels into one
command buffer with a barrier before every kernel that reads or overwrites what an earlier
kernel wrote, submits, and counts dispatches and barriers.  The fused product falls back to the
unfused chain, with a reason, when the device cannot run it (subgroup size, shared memory), when
a named target lacks a capability it needs, when its estimate is over budget, or when the
driver's statistics of its freshly created pipeline are (`RegionRunner.choose`).
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from fusec.codegen import manifest as mf
from fusec.codegen import manifest_records as mr
from fusec.codegen.targets import target_for_device
from fusec.dsl.ir import PARAMS_BUFFER
from fusec.dsl.q8_0x import q8_0x_values
from fusec.dsl.types import QUANT_BLOCK, DType, block_noun

from .buffers import DeviceBuffer
from .device import Device, RuntimeFailure
from .gate import (
    DriverCheck,
    capability,
    check_target,
    confirm,
    default_wave,
    kill_switch,
    refusal,
)
from .param_words import param_words
from .pipelines import Pipeline, pipeline_statistics
from .prebuilt import checked_modules, load_manifest, spirv_val
from .repack import device_array
from .spirv_spec import spec_mode, specialize

FENCE_TIMEOUT_NS = 600 * 10**9

NP_DTYPES = {
    "f32": np.float32,
    "f16": np.float16,
    "u32": np.uint32,
    "i32": np.int32,
    "q8_0": np.uint8,  # GGUF block bytes, as gguf.quants.quantize returns them
    "q4_0": np.uint8,
    "q4_K": np.uint8,
    "q6_K": np.uint8,
    "q8_0x": np.uint8,  # an unfused chain's q8_0 activations (fusec's aligned block layout)
}


def poison_array(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """NaN, or every bit set for integer and block buffers (a q8_0x scale reads as NaN)."""
    np_dtype = np.dtype(NP_DTYPES[dtype])
    fill = np.nan if np_dtype.kind == "f" else 0xFF
    return (
        np.full(shape, fill, np_dtype) if np_dtype.kind == "f" else np.full(shape, fill, np.uint8)
    )


def begin_commands(dev: Device, flags: int = 0) -> Any:
    """A primary command buffer from the device's pool, begun."""
    dev.check_open()
    vk = dev.vk
    with dev.memory_errors("allocating a command buffer"):
        cmd = vk.vkAllocateCommandBuffers(
            dev.device,
            vk.VkCommandBufferAllocateInfo(
                commandPool=dev.command_pool,
                level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY,
                commandBufferCount=1,
            ),
        )[0]
        vk.vkBeginCommandBuffer(cmd, vk.VkCommandBufferBeginInfo(flags=flags))
    return cmd


@contextlib.contextmanager
def one_shot(dev: Device) -> Iterator[Any]:
    """Record a command buffer, then submit it and wait."""
    vk = dev.vk
    cmd = begin_commands(dev, vk.VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT)
    yield cmd
    vk.vkEndCommandBuffer(cmd)
    submit(dev, cmd)
    vk.vkFreeCommandBuffers(dev.device, dev.command_pool, 1, [cmd])


def submit(dev: Device, cmd: Any) -> None:
    dev.check_open()
    vk = dev.vk
    with dev.memory_errors("submitting commands"):
        fence = vk.vkCreateFence(dev.device, vk.VkFenceCreateInfo(), None)
    dev.submitted = True
    try:
        with dev.memory_errors("submitting commands"):
            vk.vkQueueSubmit(
                dev.queue, 1, [vk.VkSubmitInfo(commandBufferCount=1, pCommandBuffers=[cmd])], fence
            )
            # a CPU device under load can take long; a GPU never should
            vk.vkWaitForFences(dev.device, 1, [fence], vk.VK_TRUE, FENCE_TIMEOUT_NS)
    except vk.VkErrorDeviceLost:
        raise RuntimeFailure("the Vulkan device was lost while running a kernel") from None
    except vk.VkTimeout:
        raise RuntimeFailure(
            f"the device did not finish within {FENCE_TIMEOUT_NS // 10**9} s"
        ) from None
    finally:
        vk.vkDestroyFence(dev.device, fence, None)


@attrs.frozen
class Build:
    """A build folder: manifest.json plus the SPIR-V it names, validated when loaded
    (runtime/prebuilt.py): every module's hash, header and declarations are checked before
    any device work, and pipelines are made from the bytes that were checked."""

    path: Path
    manifest: mr.Manifest
    _modules: dict[str, bytes] = attrs.field(factory=dict, eq=False, repr=False)
    # the modules spirv-val accepted, by content: kernels with the same bytes (kernels.fuse's
    # 392 kernels are 239 modules) are validated once, 12 ms a spirv-val run
    _validated: set[bytes] = attrs.field(factory=set, eq=False, repr=False)

    @staticmethod
    def load(path: str | Path) -> Build:
        folder, m = load_manifest(path)
        build = Build(folder, m)
        build._modules.update(checked_modules(folder, m))
        return build

    def region(self, name: str) -> mr.Region:
        r = self.manifest.region(name)
        if r is not None:
            return r
        names = ", ".join(r.name for r in self.manifest.regions)
        raise RuntimeFailure(f"no region '{name}' in this build", f"regions: {names}")

    def instance(
        self,
        dev: Device,
        generic: str,
        dtypes: Mapping[str, str],
        consts: Mapping[str, int | float] | None = None,
    ) -> mr.Region:
        """The instance of generic region `generic` with buffers of `dtypes` ({"W": "q4_0"})
        for `dev`: the variant of the device's target (`target_for_device`) where the build
        has one, else the one for every target (lavapipe's and an unknown device's)."""
        target = target_for_device(dev.info.name)
        found = self.manifest.instance(
            generic, dtypes, target.name if target is not None else None, consts
        )
        if found is not None:
            return found
        shown = ", ".join(f"{n}: {d}" for n, d in dtypes.items())
        raise RuntimeFailure(
            f"no instance of {generic} for {shown} in this build",
            f"add the dtype to region {generic}<...> and rebuild",
        )

    def check_program(self, program: Any) -> None:
        """Refuse a manifest whose regions differ from those of the source it carries."""
        ours = {r.name: r for r in program.regions}
        theirs = [r.name for r in self.manifest.regions]
        # a build of some regions only lists those (build_options.regions)
        chosen = self.manifest.options.regions or sorted(ours)
        if sorted(chosen) != sorted(theirs) or not set(theirs) <= set(ours):
            raise RuntimeFailure(
                f"build folder {self.path} is damaged: its manifest lists regions "
                f"({', '.join(theirs)}) other than its source declares ({', '.join(ours)})",
                "rebuild it with fusec build FILE -o DIR",
            )
        for region in self.manifest.regions:
            problem = mf.signature_mismatch(region, ours[region.name])
            if problem is not None:
                raise RuntimeFailure(
                    f"build folder {self.path} is damaged: in its manifest, region "
                    f"'{region.name}': {problem}",
                    "rebuild it with fusec build FILE -o DIR",
                )

    def verify(self, regions: list[str] | None = None) -> None:
        """Run spirv-val (where installed) on the modules of these regions (all by default)."""
        for region in self.manifest.regions:
            if regions is None or region.name in regions:
                for k in region.kernels():
                    self.spv(k)

    def spv(self, kernel: mr.Kernel) -> bytes:
        """The checked bytes of a kernel's module (spirv-val'd on first use)."""
        name = kernel.name
        data = self._modules.get(name)
        if data is None:
            raise RuntimeFailure(f"kernel {name} is not in build folder {self.path}")
        if data not in self._validated:
            spirv_val(self.path, kernel.spv, data)
            self._validated.add(data)
        return data


@attrs.frozen
class RunResult:
    outputs: dict[str, np.ndarray]
    path: str  # "fused" | "fallback(reason)" | "unfused"
    dispatches: int
    barriers: int
    subgroup_sizes: tuple[int, ...]
    # the driver's numbers next to the estimate, per fused kernel, where the device reports
    # pipeline statistics (the gate's confirmation; empty otherwise and for the unfused chain)
    driver: tuple[DriverCheck, ...] = ()


# what a specialization constant of each dtype can hold (the manifest's constants are u32 or f32)
INT_RANGES = {"u32": (0, 2**32 - 1), "i32": (-(2**31), 2**31 - 1)}
F32_MAX = float(np.finfo(np.float32).max)


def const_values(
    region: mr.Region, overrides: Mapping[str, int | float] | None
) -> dict[str, int | float]:
    """Every constant of the region: its default, or the override, refused in one sentence
    when the region has no such constant or the value does not fit the constant (finite,
    within its dtype, within its declared range)."""
    values: dict[str, int | float] = {c.name: c.default for c in region.consts}
    for name, v in (overrides or {}).items():
        decl = region.const(name)
        if decl is None:
            known = ", ".join(c.name for c in region.consts) or "none"
            raise RuntimeFailure(
                f"region '{region.name}' has no constant '{name}'", f"constants: {known}"
            )
        values[name] = const_value(decl, v)
    problem = mf.expression_error(region, values)
    if problem is not None:
        shown = ", ".join(f"{n} = {v}" for n, v in values.items())
        raise RuntimeFailure(f"region '{region.name}' cannot run at {shown}: {problem}")
    check_state_writes(region, values)
    for buf in (*region.inputs, *region.outputs):  # a q8_0x output is blocks too
        if buf.dtype in mf.QUANT_BLOCK_BYTES and buf.shape:
            k = mf.eval_expr(buf.shape[-1], values)
            block = mf.QUANT_BLOCK_ELEMS[buf.dtype]
            if k % block:
                raise RuntimeFailure(
                    f"{buf.dtype} {block_noun(buf.dtype)} '{buf.name}' of region "
                    f"'{region.name}' would "
                    f"have rows of {k} elements, not a multiple of {block}",
                    f"choose constants that make whole {block}-element blocks",
                )
    return values


def const_value(decl: mr.Const, v: object) -> int | float:
    """`v` as the value of the constant `decl`, or RuntimeFailure in one sentence: a constant
    must be a finite number that its dtype holds (a u32 a whole number from 0 to 2^32 - 1, an
    f32 at most 3.4e38 in magnitude: struct.pack would fail on anything else) and that lies in
    its declared range."""
    name, dtype = decl.name, decl.dtype
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise RuntimeFailure(f"constant '{name}' must be a number, not {v!r}")
    value: int | float = int(v) if isinstance(v, numbers.Integral) else float(v)
    if isinstance(value, float) and not math.isfinite(value):
        raise RuntimeFailure(f"constant '{name}' must be a finite number, not {value}")
    if dtype in INT_RANGES and isinstance(value, float) and not value.is_integer():
        what = "run-time parameter" if decl.runtime else "constant"
        raise RuntimeFailure(f"{what} '{name}' is {dtype}: it must be a whole number, not {v}")
    lo, hi = decl.lo, decl.hi
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise RuntimeFailure(f"constant '{name}' = {v} is outside its range {lo} .. {hi}")
    if dtype in INT_RANGES:
        lo, hi = INT_RANGES[dtype]
        if not lo <= value <= hi:
            raise RuntimeFailure(
                f"constant '{name}' = {v} is outside the {dtype} range {lo} .. {hi}"
            )
        return int(value)
    if abs(value) > F32_MAX:
        raise RuntimeFailure(
            f"constant '{name}' = {v} is outside the f32 range -{F32_MAX:g} .. {F32_MAX:g}"
        )
    if value != 0 and np.float32(value) == 0:
        # as a source literal would be (dsl/parse.py): a nonzero value f32 cannot hold
        raise RuntimeFailure(
            f"constant '{name}' = {v} rounds to 0 in f32, whose least magnitude is 1.4e-45",
            "use 0, or a magnitude of at least 1.4e-45",
        )
    return float(value)


def check_state_writes(region: mr.Region, values: Mapping[str, int | float]) -> None:
    """A state output written at a run-time index (a cache row at `pos`) must have that row."""
    for w in region.state_writes:
        buf = next(b for b in region.outputs if b.name == w.buffer)
        dim = mf.eval_expr(buf.shape[w.axis], values)
        if values[w.at] >= dim:
            raise RuntimeFailure(
                f"'{w.at}' = {values[w.at]} is past the end of '{w.buffer}' "
                f"(dimension {w.axis} has {dim} entries)",
                "a decode step cannot write past the cache's capacity",
            )


def shape_of(buf: mr.Buffer, consts: Mapping[str, int | float]) -> tuple[int, ...]:
    """The numpy shape of a buffer's array (bytes of blocks for quantized weights)."""
    return mf.storage_shape(buf.dtype, tuple(mf.eval_expr(d, consts) for d in buf.shape))


def check_inputs(
    region: mr.Region,
    inputs: Mapping[str, np.ndarray],
    consts: Mapping[str, int | float],
    allow_nonfinite: bool = False,
) -> None:
    """Refuse wrong arrays before anything is dispatched: missing, of another dtype or shape,
    or (unless `allow_nonfinite`) holding NaN or infinity."""
    for buf in [*region.inputs, *region.state_inputs()]:
        name = buf.name
        what = "state buffer" if buf.state else "input"
        if name not in inputs:
            raise RuntimeFailure(f"{what} '{name}' of region '{region.name}' is missing")
        a = inputs[name]
        if not isinstance(a, np.ndarray):
            raise RuntimeFailure(f"{what} '{name}' must be a numpy array, not {type(a).__name__}")
        want_shape, want_dtype = shape_of(buf, consts), np.dtype(NP_DTYPES[buf.dtype])
        if buf.dtype in mf.QUANT_BLOCK_BYTES:
            want_bytes = int(np.prod(want_shape))
            if a.dtype != want_dtype or a.nbytes != want_bytes or a.shape != want_shape:
                if buf.dtype == "q8_0x":  # fusec's aligned q8_0 blocks (dsl/q8_0x.py)
                    raise RuntimeFailure(
                        f"q8_0x input '{name}' must be uint8 blocks of shape {want_shape} "
                        f"({want_bytes} bytes: 48 per 32 elements), not {a.dtype} of shape "
                        f"{tuple(a.shape)} ({a.nbytes} bytes)",
                        "round the vector with fusec.dsl.q8_0x.quantize_q8_0x(values), or "
                        "pass a kernel's q8_0x output",
                    )
                raise RuntimeFailure(
                    f"{buf.dtype} weight '{name}' must be uint8 blocks of shape {want_shape} "
                    f"({want_bytes} bytes), not {a.dtype} of shape {tuple(a.shape)} "
                    f"({a.nbytes} bytes)",
                    "pass the block bytes as a GGUF file holds them, or as "
                    f"gguf.quants.quantize(w, GGMLQuantizationType.{buf.dtype.upper()}) "
                    "returns them",
                )
        elif a.dtype != want_dtype:
            raise RuntimeFailure(f"input '{name}' must have dtype {want_dtype}, not {a.dtype}")
        elif tuple(a.shape) != want_shape:
            raise RuntimeFailure(
                f"input '{name}' must have shape {want_shape}, not {tuple(a.shape)}"
            )
        n = 0 if allow_nonfinite else nonfinite_count(buf.dtype, a)
        if n:
            values = "block scale" if buf.dtype in mf.QUANT_BLOCK_BYTES else "value"
            raise RuntimeFailure(
                f"{what} '{name}' of region '{region.name}' holds {n} non-finite "
                f"{values}{'s' if n > 1 else ''} (NaN or infinity)",
                "pass allow_nonfinite=True (fusec check --allow-nonfinite) to run on them",
            )


def nonfinite_count(dtype: str, a: np.ndarray) -> int:
    """How many values of a float array, or f16 block scales of a GGUF weight (at the byte
    offsets of QUANT_SCALE_OFFSETS in each block), are NaN or infinite."""
    if dtype in mf.QUANT_SCALE_OFFSETS:
        blocks = a.reshape(-1, mf.QUANT_BLOCK_BYTES[dtype])
        at = [o + i for o in mf.QUANT_SCALE_OFFSETS[dtype] for i in (0, 1)]
        a = np.ascontiguousarray(blocks[:, at]).view(np.float16)
    elif a.dtype.kind != "f":
        return 0
    return int(a.size - np.count_nonzero(np.isfinite(a)))


def device_refusal(dev: Device, kernel: mr.Kernel, consts: Mapping[str, int | float]) -> str | None:
    """Why this device cannot run `kernel` (None when it can)."""
    sub = kernel.subgroup
    size = dev.subgroup_size_for(sub.kind, sub.sizes)
    if size is not None and kernel.workgroup_size < size:
        # the generated loops stride by the subgroup size: a workgroup with fewer lanes than
        # a subgroup would skip the missing lanes' elements (found by the front-end fuzzer)
        return f"workgroup {kernel.workgroup_size} is smaller than its subgroup ({size})"
    if size is None:
        want = (
            "any"
            if sub.kind == "any"
            else (
                f">= {sub.sizes[0]}" if sub.kind == "at_least" else " | ".join(map(str, sub.sizes))
            )
        )
        return (
            f"subgroup size {want} unavailable on {dev.info.name} "
            f"({dev.info.min_subgroup_size}..{dev.info.max_subgroup_size})"
        )
    need = mf.shared_bytes(kernel, consts)
    if need > dev.info.max_shared_bytes:
        return f"needs {need} bytes of shared memory, device allows {dev.info.max_shared_bytes}"
    if kernel.workgroup_size > dev.info.max_workgroup_size:
        return f"workgroup {kernel.workgroup_size} > device limit {dev.info.max_workgroup_size}"
    return feature_refusal(dev, kernel)


def feature_refusal(dev: Device, kernel: mr.Kernel) -> str | None:
    """The Vulkan feature `kernel` needs that the device lacks (None when it has them all).
    Never give the driver such a kernel: ACO aborts the process on a float atomic add for
    RDNA2 (FACTS.md)."""
    if "storage_buffer_16bit" in kernel.features and not dev.info.storage16:
        return "device lacks storageBuffer16BitAccess"
    if "atomic_float_add" in kernel.features and not dev.info.atomic_float:
        return "device lacks shaderBufferFloat32AtomicAdd"
    if "integer_dot_product" in kernel.features and not dev.info.int_dot:
        return "device lacks shaderIntegerDotProduct"
    if "float64" in kernel.features and not dev.info.float64:
        return "device lacks shaderFloat64"
    if "vulkan_memory_model" in kernel.features and not dev.info.memory_model:
        return "device lacks vulkanMemoryModel"
    return None


def derived_values(
    kernel: mr.Kernel, consts: Mapping[str, int | float]
) -> list[tuple[int, str, int | float]]:
    """The kernel's derived specialization constants at `consts`; RuntimeFailure, in one
    sentence, when the constants make its index math divide by zero."""
    try:
        return mf.derived_specs(kernel, consts)
    except ValueError as e:
        shown = ", ".join(f"{n} = {v}" for n, v in consts.items())
        raise RuntimeFailure(
            f"kernel {kernel.name} cannot run at {shown}: its index math {e}"
        ) from None


def check_runnable(region: mr.Region, consts: Mapping[str, int | float]) -> None:
    """Refuse constants at which any kernel of the region (fused or unfused) cannot run, before
    anything runs (the numpy reference would only warn)."""
    for k in region.kernels():
        derived_values(k, consts)
        loop_count(k, consts)


def loop_count(kernel: mr.Kernel, consts: Mapping[str, int | float]) -> int:
    """How many times an unfused repeat's kernel runs at `consts` (0 for other kernels); a
    count past mf.MAX_LOOP_COUNT is refused (dsl.check refuses such a repeat in a source)."""
    if kernel.loop_count is None:
        return 0
    try:
        count = mf.eval_expr(kernel.loop_count, consts)
    except (ValueError, ZeroDivisionError, KeyError):
        raise RuntimeFailure(f"kernel {kernel.name}'s repeat count cannot be computed") from None
    if count > mf.MAX_LOOP_COUNT:
        raise RuntimeFailure(
            f"kernel {kernel.name} would repeat {count} times, more than {mf.MAX_LOOP_COUNT}",
            "rebuild the folder from its source",
        )
    return max(count, 0)


def buffer_bytes(region: mr.Region, consts: Mapping[str, int | float]) -> dict[str, int]:
    """Bytes of each buffer a run of the region allocates (inputs, outputs, intermediates), as
    DeviceBuffer rounds them; Python integers, so no size overflows."""
    out = {}
    for b in [*region.inputs, *region.outputs, *region.intermediates]:
        n = math.prod(shape_of(b, consts)) * np.dtype(NP_DTYPES[b.dtype]).itemsize
        out[b.name] = max(4, (n + 3) // 4 * 4)
    return out


def region_at(region: mr.Region, consts: Mapping[str, int | float]) -> str:
    """A region and the constants that size its buffers: `region 'r' at K=4096, N=12288`."""
    shown = ", ".join(
        f"{c.name}={consts[c.name]}"
        for c in region.consts
        if c.dtype in INT_RANGES and not c.runtime
    )
    return f"region '{region.name}'" + (f" at {shown}" if shown else "")


def format_bytes(n: int) -> str:
    """`n` bytes for a reader: 512 bytes, 16.0 KiB, 8.0 GiB."""
    size, unit = float(n), "bytes"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{n} bytes" if unit == "bytes" else f"{size:.1f} {unit}"


def check_memory(dev: Device, sizes: Mapping[str, int], owner: str) -> None:
    """Refuse, before anything is allocated, buffers (`sizes`: bytes by buffer name, of
    `owner`, e.g. `region_at(...)`) that the device cannot hold: one longer than a binding may
    span (maxStorageBufferRange), or all together more than its largest device-local heap."""
    if not sizes:
        return
    name, largest = max(sizes.items(), key=lambda kv: kv[1])
    if largest > dev.info.max_buffer_bytes:
        raise RuntimeFailure(
            f"buffer '{name}' of {owner} would take {format_bytes(largest)}, more than the "
            f"{format_bytes(dev.info.max_buffer_bytes)} one buffer may span on "
            f"'{dev.info.name}' (maxStorageBufferRange)",
            "choose smaller constants",
        )
    total = sum(sizes.values())
    if dev.info.memory_bytes and total > dev.info.memory_bytes:
        biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
        parts = ", ".join(f"'{n}' {format_bytes(b)}" for n, b in biggest)
        more = ", ..." if len(sizes) > len(biggest) else ""
        raise RuntimeFailure(
            f"{owner} needs {format_bytes(total)} of buffers ({parts}{more}), more than the "
            f"{format_bytes(dev.info.memory_bytes)} of device memory on '{dev.info.name}'",
            "choose smaller constants",
        )


class RegionRunner:
    """Runs one region of a build on one device, fused or unfused."""

    def __init__(
        self,
        dev: Device,
        build: Build,
        region: str,
        consts: Mapping[str, int | float] | None = None,
        target: str | None = None,
        min_waves: int | None = None,
        external: Mapping[str, DeviceBuffer] | None = None,
    ) -> None:
        """`target` gates the fused product on a named target instead of the device's own;
        `min_waves` overrides the budget's minimum waves per SIMD for this call; `external`
        supplies buffers owned by the caller (a decode step's shared activations and weights),
        by region buffer name."""
        dev.check_open()
        self.dev, self.build = dev, build
        self.region = build.region(region)
        self.consts = const_values(self.region, consts)
        self.min_waves = min_waves
        self.target = check_target(target) if target else target_for_device(dev.info.name)
        self.target_is_device = target is None
        self._external = dict(external or {})
        for name, buf in self._external.items():
            decl = self._buffer_decls().get(name)
            if decl is None:
                raise RuntimeFailure(f"region '{region}' has no buffer '{name}'")
            need = (
                int(np.prod(shape_of(decl, self.consts))) * np.dtype(NP_DTYPES[decl.dtype]).itemsize
            )
            if buf.size < need:
                raise RuntimeFailure(
                    f"buffer for '{name}' of region '{region}' has {buf.size} bytes, needs {need}"
                )
        self._buffers: dict[str, DeviceBuffer] = {}
        self._pipelines: list[Pipeline] = []
        # the gate's confirmation: fused pipelines created with statistics, kept for the next
        # pipelines_for; the verdict is made once per runner (its constants are fixed)
        self._confirmed: dict[str, tuple[Pipeline, int]] = {}
        self._confirmation: tuple[str | None, tuple[DriverCheck, ...]] | None = None
        self.driver_checks: tuple[DriverCheck, ...] = ()

    def _buffer_decls(self) -> dict[str, mr.Buffer]:
        r = self.region
        return {b.name: b for b in [*r.inputs, *r.outputs, *r.intermediates]}

    def ensure_buffers(self) -> None:
        """Allocate the buffers not supplied by the caller (once), after checking that the
        device can hold them (`check_memory`); none stay allocated when one fails."""
        self.dev.check_open()
        if self._buffers:
            return
        every = buffer_bytes(self.region, self.consts)
        sizes = {n: b for n, b in every.items() if n not in self._external}
        check_memory(self.dev, sizes, region_at(self.region, self.consts))
        params = self.region.params()
        buffers: dict[str, DeviceBuffer] = {}
        try:
            for name in self._buffer_decls():
                if name in self._external:
                    buffers[name] = self._external[name]
                else:
                    buffers[name] = DeviceBuffer(self.dev, sizes[name])
            if params:
                # host-visible: new values are written between submissions of recorded commands
                buffers[PARAMS_BUFFER] = DeviceBuffer(self.dev, 4 * len(params), host=True)
            for name in self.region.counters():
                # arrival counters start at 0; each dispatch leaves them at 0 (kir.Arrive)
                counter = self.region.buffer(name)
                if name not in self._external and counter is not None:
                    buffers[name].upload(np.zeros(shape_of(counter, self.consts), np.uint32))
        except BaseException:
            for name, b in buffers.items():
                if name not in self._external:
                    b.destroy()
            raise
        self._buffers = buffers
        if params:
            self.set_params({})

    def set_params(self, values: Mapping[str, int | float]) -> None:
        """Set run-time parameters (e.g. `pos`) for the next submission; nothing is re-recorded."""
        params = self.region.params()
        if values:
            # every constant keeps its value: the grid of a command buffer recorded after this
            # is sized from them (a constant back at its default here dispatched 256 of the
            # H200 layer split's 512 workgroups, half its heads, in every timed step)
            self.consts = const_values(self.region, {**self.consts, **values})
        if params and PARAMS_BUFFER in self._buffers:
            data = param_words(params, self.consts)  # an f32 param as its bits
            self._buffers[PARAMS_BUFFER].upload(data)

    def choose(self, fused: bool) -> tuple[str, Sequence[mr.Kernel]]:
        """Which product runs: ('fused', kernels), ('fallback(reason)', unfused kernels) or
        ('unfused', kernels).  In order: the kill switches; a named target's capabilities
        (`fallback(capability: ...)`; the device's own are in `device_refusal`); the budget on
        the estimate (`fallback(budget: ...)`); what the device can run; and, where the device
        reports pipeline statistics, the budget on the driver's numbers for the freshly created
        fused pipelines (`fallback(driver: ...)`, see `driver_checks`)."""
        self.driver_checks = ()
        if not fused:
            return "unfused", self.region.unfused
        known = [r.name for r in self.build.manifest.regions]
        switched = kill_switch(self.region.name, known)
        if switched is not None:
            return f"fallback({switched})", self.region.unfused
        if self.target is not None:
            first = self.region.fused[0]
            if self.target_is_device:
                sub = first.subgroup
                wave = self.dev.subgroup_size_for(sub.kind, sub.sizes) or 0
            else:
                lacks = capability(self.region, self.consts, self.target)
                if lacks is not None:
                    return f"fallback(capability: {lacks})", self.region.unfused
                wave = default_wave(self.target, first.workgroup_size, first.subgroup)
            if wave in self.target.wave_sizes:
                why = refusal(self.region, self.consts, self.target, wave, self.min_waves)
                if why is not None:
                    return f"fallback(budget: {why})", self.region.unfused
        path, kernels = "fused", self.region.fused
        for k in self.region.fused:
            reason = device_refusal(self.dev, k, self.consts)
            if reason is not None:
                alternate = self.region.fused_shared
                if alternate and all(
                    device_refusal(self.dev, a, self.consts) is None for a in alternate
                ):
                    # the tile's group is wider than this device's subgroup: same kernel,
                    # lanes exchange through shared memory
                    path, kernels = "fused(shared exchange)", alternate
                    break
                return f"fallback({reason})", self.region.unfused
        why = self._confirm(kernels)
        if why is not None:
            return f"fallback(driver: {why})", self.region.unfused
        return path, kernels

    def _confirm(self, kernels: Sequence[mr.Kernel]) -> str | None:
        """The gate at pipeline creation: create the fused pipelines with statistics and judge
        the driver's numbers on the device's own target (None: accepted, or nothing to judge
        with: no statistics, or a device that is no known target).  Accepted pipelines are kept
        for pipelines_for; refused ones are destroyed.  Sets `driver_checks`."""
        if self._confirmation is not None:
            why, self.driver_checks = self._confirmation
            return why
        target = target_for_device(self.dev.info.name)
        if not self.dev.statistics or target is None:
            return None
        checks: list[DriverCheck] = []
        why = None
        for k in kernels:
            if k.name not in self._confirmed:
                self._confirmed[k.name] = self._pipeline(k, capture_statistics=True)
            p, size = self._confirmed[k.name]
            if size not in target.wave_sizes:
                continue  # a subgroup size the target model does not know: nothing to judge
            check = confirm(
                self.region,
                k,
                self.consts,
                target,
                size,
                pipeline_statistics(self.dev, p),
                self.min_waves,
            )
            if check is not None:
                checks.append(check)
                why = why or check.refusal
        if why is not None:
            self._drop_confirmed()
        self._confirmation = (why, tuple(checks))
        self.driver_checks = tuple(checks)
        return why

    def _drop_confirmed(self) -> None:
        for p, _ in self._confirmed.values():
            p.destroy()
        self._confirmed = {}

    def buffer(self, name: str) -> DeviceBuffer:
        return self._buffers[name]

    def prepare(
        self,
        inputs: Mapping[str, np.ndarray],
        poison: bool = True,
        allow_nonfinite: bool = False,
        checked: bool = False,
    ) -> None:
        """Check and upload inputs; fill outputs and intermediates with NaN.  Inputs holding NaN
        or infinity are refused unless `allow_nonfinite`.  `checked`: the caller has passed
        these very arrays through `check_inputs` already (a check runs both products on one
        draw; scanning a 300 MB weight for NaN again takes a second)."""
        self.dev.check_open()
        if not checked:
            check_inputs(self.region, inputs, self.consts, allow_nonfinite)
        self.ensure_buffers()
        for b in [*self.region.inputs, *self.region.state_inputs()]:
            self._buffers[b.name].upload(device_array(b, np.asarray(inputs[b.name])))
        if poison:
            counters = self.region.counters()
            for b in [*self.region.outputs, *self.region.intermediates]:
                if b.state or b.name in counters:
                    # holds its earlier contents; a counter holds 0 after every dispatch
                    # (kir.Arrive), so repeated runs show whether the kernel resets it
                    continue
                shape = shape_of(b, self.consts)
                self._buffers[b.name].upload(poison_array(b.dtype, shape))

    def pipelines_for(
        self, kernels: Sequence[mr.Kernel], sets: int = 1
    ) -> tuple[list[Pipeline], list[int]]:
        """Pipelines (descriptor set 0 bound to this runner's buffers) and subgroup sizes."""
        self.dev.check_open()
        for k in kernels:
            reason = device_refusal(self.dev, k, self.consts)
            if reason is not None:
                raise RuntimeFailure(
                    f"kernel {k.name} cannot run on {self.dev.info.name}: {reason}"
                )
        pipelines, sizes = [], []
        try:
            for k in kernels:
                kept = self._confirmed.pop(k.name, None)
                if kept is not None and sets == 1:
                    p, size = kept  # created and judged by the gate's confirmation
                else:
                    if kept is not None:
                        kept[0].destroy()
                    p, size = self._pipeline(k, sets=sets)
                pipelines.append(p)
                p.bind(
                    {
                        b.binding: (
                            self._buffers[b.buffer].handle,
                            self._buffers[b.buffer].size,
                        )
                        for b in k.bindings
                    }
                )
                sizes.append(size)
        except BaseException:
            for p in pipelines:
                p.destroy()
            raise
        return pipelines, sizes

    def _pipeline(
        self, k: mr.Kernel, sets: int = 1, capture_statistics: bool = False
    ) -> tuple[Pipeline, int]:
        """One kernel's pipeline at this runner's constants, and its subgroup size."""
        spec_decl: list[tuple[int, str, int | float]] = [
            (c.spec_id, c.dtype, self.consts[c.name]) for c in self.region.consts if not c.runtime
        ]
        derived = derived_values(k, self.consts)
        sub = k.subgroup
        size = self.dev.subgroup_size_for(sub.kind, sub.sizes)
        assert size is not None
        required = size if self.dev.info.size_control else None
        full = (
            self.dev.info.full_subgroups and required is not None and k.workgroup_size % size == 0
        )
        spec = spec_decl + derived
        p = Pipeline(
            self.dev,
            specialize(self.build.spv(k), spec, spec_mode()),
            len(k.bindings),
            spec,
            required,
            full,
            capture_statistics=capture_statistics,
            sets=sets,
        )
        return p, size

    def record(
        self,
        cmd: Any,
        kernels: Sequence[mr.Kernel],
        pipelines: list[Pipeline],
        sizes: list[int],
        set_index: int = 0,
        after: Any = None,
        dirty: set[int] | None = None,
    ) -> tuple[int, int]:
        """Record the kernels with a barrier before each one that touches a buffer written
        since the last barrier.  `dirty` (buffers written since the last barrier, by identity)
        carries that state across regions recorded into one command buffer.  Returns
        (dispatches, barriers)."""
        vk = self.dev.vk
        dispatches = barriers = 0
        dirty = set() if dirty is None else dirty
        for k, p, size in self._schedule(kernels, pipelines, sizes):
            touched = {id(self._buffers[b.buffer]) for b in k.bindings}
            if k.zero_outputs:
                # split-K kernels add into their outputs: zero them first (a transfer, then a
                # barrier before the kernel reads them)
                for name in k.zero_outputs:
                    buf = self._buffers[name]
                    vk.vkCmdFillBuffer(cmd, buf.handle, 0, buf.size, 0)
                fill = vk.VkMemoryBarrier(
                    srcAccessMask=vk.VK_ACCESS_TRANSFER_WRITE_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT,
                    dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT,
                )
                src_stage = (
                    vk.VK_PIPELINE_STAGE_TRANSFER_BIT | vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
                )
                vk.vkCmdPipelineBarrier(
                    cmd,
                    src_stage,
                    vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                    0,
                    1,
                    [fill],
                    0,
                    None,
                    0,
                    None,
                )
                barriers += 1
                dirty.clear()
            if touched & dirty:
                barrier = vk.VkMemoryBarrier(
                    srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT,
                    dstAccessMask=vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT,
                )
                stage = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
                vk.vkCmdPipelineBarrier(cmd, stage, stage, 0, 1, [barrier], 0, None, 0, None)
                barriers += 1
                dirty.clear()
            vk.vkCmdBindPipeline(cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, p.pipeline)
            vk.vkCmdBindDescriptorSets(
                cmd,
                vk.VK_PIPELINE_BIND_POINT_COMPUTE,
                p.layout,
                0,
                1,
                [p.sets[set_index]],
                0,
                None,
            )
            vk.vkCmdDispatch(cmd, mf.workgroups(k, self.consts, size), 1, 1)
            if after is not None:
                after(dispatches, k.name)  # e.g. a timestamp after each dispatch
            dispatches += 1
            dirty |= {id(self._buffers[b.buffer]) for b in k.bindings if b.writes}
        return dispatches, barriers

    def _schedule(
        self, kernels: Sequence[mr.Kernel], pipelines: list[Pipeline], sizes: list[int]
    ) -> list[tuple[mr.Kernel, Pipeline, int]]:
        """Kernels in dispatch order: consecutive kernels with the same `loop` id (an unfused
        repeat) run `loop_count` times."""
        items = list(zip(kernels, pipelines, sizes, strict=True))
        out: list[tuple[mr.Kernel, Pipeline, int]] = []
        i = 0
        while i < len(items):
            loop = items[i][0].loop
            if loop is None:
                out.append(items[i])
                i += 1
                continue
            j = i
            while j < len(items) and items[j][0].loop == loop:
                j += 1
            out += items[i:j] * loop_count(items[i][0], self.consts)
            i = j
        return out

    def run(
        self,
        inputs: Mapping[str, np.ndarray],
        fused: bool = True,
        poison: bool = True,
        allow_nonfinite: bool = False,
        checked: bool = False,
    ) -> RunResult:
        """Run one product once and download every output.  Inputs holding NaN or infinity are
        refused unless `allow_nonfinite`; `checked` as for `prepare`."""
        self.dev.check_open()
        path, kernels = self.choose(fused)
        self.prepare(inputs, poison, allow_nonfinite, checked)
        pipelines, sizes = self.pipelines_for(kernels)
        self._pipelines.extend(pipelines)
        with one_shot(self.dev) as cmd:
            dispatches, barriers = self.record(cmd, kernels, pipelines, sizes)
        outputs = {
            b.name: self._buffers[b.name].download(NP_DTYPES[b.dtype], shape_of(b, self.consts))
            for b in self.region.outputs
        }
        return RunResult(outputs, path, dispatches, barriers, tuple(sizes), self.driver_checks)

    def intermediate_values(self, name: str) -> np.ndarray | None:
        """The last run's values of an intermediate of the unfused chain stored as q8_0x
        blocks (dequantized; None when the region has no such intermediate)."""
        b = next((b for b in self.region.intermediates if b.name == name), None)
        if b is None or b.dtype != DType.Q8_0X.value or name not in self._buffers:
            return None
        shape = tuple(mf.eval_expr(d, self.consts) for d in b.shape)  # elements
        raw = self._buffers[name].download(np.uint8, (self._buffers[name].size,))
        rows, k = int(np.prod(shape[:-1], dtype=np.int64)), shape[-1]
        padded = -(-k // QUANT_BLOCK) * QUANT_BLOCK
        flat = q8_0x_values(raw, rows * padded).reshape(*shape[:-1], padded)
        return np.asarray(flat[..., :k])

    def close(self) -> None:
        self._drop_confirmed()
        for p in self._pipelines:
            p.destroy()
        for name, b in self._buffers.items():
            if name not in self._external:
                b.destroy()
        self._pipelines, self._buffers = [], {}
