"""Running a region's product (fused kernels or the unfused chain) from a build folder.

Loads SPIR-V + manifest (no compiler needed), allocates buffers, records the kernels into one
command buffer with a barrier before every kernel that reads or overwrites what an earlier
kernel wrote, submits, and counts dispatches and barriers.  The fused product falls back to the
unfused chain, with a reason, when the device cannot run it (subgroup size, shared memory).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from codegen import manifest as mf
from codegen.targets import target_for_device
from dsl.ir import PARAMS_BUFFER

from .buffers import DeviceBuffer
from .device import Device, RuntimeFailure
from .gate import check_target, default_wave, kill_switch, refusal
from .pipelines import Pipeline, check_spirv

FENCE_TIMEOUT_NS = 600 * 10**9

NP_DTYPES = {
    "f32": np.float32,
    "f16": np.float16,
    "u32": np.uint32,
    "i32": np.int32,
    "q8_0": np.uint8,  # GGUF block bytes, as gguf.quants.quantize returns them
    "q4_0": np.uint8,
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
    vk = dev.vk
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
    vk = dev.vk
    fence = vk.vkCreateFence(dev.device, vk.VkFenceCreateInfo(), None)
    dev.submitted = True
    try:
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
    """A build folder: manifest.json plus the SPIR-V it names."""

    path: Path
    manifest: dict[str, Any]

    @staticmethod
    def load(path: str | Path) -> Build:
        p = Path(path)
        mpath = p / "manifest.json" if p.is_dir() else p
        try:
            data = json.loads(mpath.read_text())
        except (OSError, ValueError) as exc:
            raise RuntimeFailure(
                f"cannot read build manifest {mpath}: {exc}", "run fusec build FILE -o DIR first"
            ) from None
        if data.get("format") != mf.FORMAT:
            raise RuntimeFailure(f"{mpath} is not a {mf.FORMAT} manifest")
        return Build(mpath.parent, data)

    def region(self, name: str) -> dict[str, Any]:
        for r in self.manifest["regions"]:
            if r["name"] == name:
                return dict(r)
        names = ", ".join(r["name"] for r in self.manifest["regions"])
        raise RuntimeFailure(f"no region '{name}' in this build", f"regions: {names}")

    def spv(self, kernel: Mapping[str, Any]) -> bytes:
        path = self.path / kernel["spv"]
        try:
            data = path.read_bytes()
        except OSError:
            raise RuntimeFailure(f"missing SPIR-V module {path}", "rebuild the folder") from None
        check_spirv(data, str(path))
        return data


@attrs.frozen
class RunResult:
    outputs: dict[str, np.ndarray]
    path: str  # "fused" | "fallback(reason)" | "unfused"
    dispatches: int
    barriers: int
    subgroup_sizes: tuple[int, ...]


def const_values(
    region: Mapping[str, Any], overrides: Mapping[str, int | float] | None
) -> dict[str, int | float]:
    values: dict[str, int | float] = {c["name"]: c["default"] for c in region["consts"]}
    for name, v in (overrides or {}).items():
        decl = next((c for c in region["consts"] if c["name"] == name), None)
        if decl is None:
            known = ", ".join(c["name"] for c in region["consts"]) or "none"
            raise RuntimeFailure(
                f"region '{region['name']}' has no constant '{name}'", f"constants: {known}"
            )
        if decl["dtype"] == "u32" and (not float(v).is_integer() or v < 0):
            raise RuntimeFailure(f"constant '{name}' must be a non-negative integer, not {v}")
        lo, hi = decl["min"], decl["max"]
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise RuntimeFailure(f"constant '{name}' = {v} is outside its range {lo} .. {hi}")
        values[name] = int(v) if decl["dtype"] == "u32" else float(v)
    check_state_writes(region, values)
    for buf in region["inputs"]:
        if buf["dtype"] in mf.QUANT_BLOCK_BYTES and buf["shape"]:
            k = mf.eval_json(buf["shape"][-1], values)
            if k % mf.QUANT_BLOCK:
                raise RuntimeFailure(
                    f"{buf['dtype']} weight '{buf['name']}' of region '{region['name']}' would "
                    f"have rows of {k} elements, not a multiple of {mf.QUANT_BLOCK}",
                    "choose constants that make whole 32-element blocks",
                )
    return values


def check_state_writes(region: Mapping[str, Any], values: Mapping[str, int | float]) -> None:
    """A state output written at a run-time index (a cache row at `pos`) must have that row."""
    for w in region.get("state_writes", []):
        buf = next(b for b in region["outputs"] if b["name"] == w["buffer"])
        dim = mf.eval_json(buf["shape"][w["axis"]], values)
        if values[w["at"]] >= dim:
            raise RuntimeFailure(
                f"'{w['at']}' = {values[w['at']]} is past the end of '{w['buffer']}' "
                f"(dimension {w['axis']} has {dim} entries)",
                "a decode step cannot write past the cache's capacity",
            )


def runtime_params(region: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The region's run-time parameters, in buffer-slot order."""
    return sorted((c for c in region["consts"] if c.get("runtime")), key=lambda c: c["spec_id"])


def state_inputs(region: Mapping[str, Any]) -> list[dict[str, Any]]:
    """State outputs: their contents before the run are inputs too."""
    return [b for b in region["outputs"] if b.get("state")]


def shape_of(buf: Mapping[str, Any], consts: Mapping[str, int | float]) -> tuple[int, ...]:
    """The numpy shape of a buffer's array (bytes of blocks for quantized weights)."""
    return mf.storage_shape(buf["dtype"], tuple(mf.eval_json(d, consts) for d in buf["shape"]))


def check_inputs(
    region: Mapping[str, Any], inputs: Mapping[str, np.ndarray], consts: Mapping[str, int | float]
) -> None:
    """Refuse wrong arrays before anything is dispatched."""
    for buf in [*region["inputs"], *state_inputs(region)]:
        name = buf["name"]
        if name not in inputs:
            what = "state buffer" if buf.get("state") else "input"
            raise RuntimeFailure(f"{what} '{name}' of region '{region['name']}' is missing")
        a = inputs[name]
        want_shape, want_dtype = shape_of(buf, consts), np.dtype(NP_DTYPES[buf["dtype"]])
        if buf["dtype"] in mf.QUANT_BLOCK_BYTES:
            want_bytes = int(np.prod(want_shape))
            if a.dtype != want_dtype or a.nbytes != want_bytes or a.shape != want_shape:
                raise RuntimeFailure(
                    f"{buf['dtype']} weight '{name}' must be uint8 blocks of shape {want_shape} "
                    f"({want_bytes} bytes), not {a.dtype} of shape {tuple(a.shape)} "
                    f"({a.nbytes} bytes)",
                    "quantize with gguf.quants.quantize(w, GGMLQuantizationType."
                    f"{buf['dtype'].upper()})",
                )
            continue
        if a.dtype != want_dtype:
            raise RuntimeFailure(f"input '{name}' must have dtype {want_dtype}, not {a.dtype}")
        if tuple(a.shape) != want_shape:
            raise RuntimeFailure(
                f"input '{name}' must have shape {want_shape}, not {tuple(a.shape)}"
            )


def device_refusal(
    dev: Device, kernel: Mapping[str, Any], consts: Mapping[str, int | float]
) -> str | None:
    """Why this device cannot run `kernel` (None when it can)."""
    sub = kernel["subgroup"]
    if dev.subgroup_size_for(sub["kind"], sub["sizes"]) is None:
        want = (
            "any"
            if sub["kind"] == "any"
            else (
                f">= {sub['sizes'][0]}"
                if sub["kind"] == "at_least"
                else " | ".join(map(str, sub["sizes"]))
            )
        )
        return (
            f"subgroup size {want} unavailable on {dev.info.name} "
            f"({dev.info.min_subgroup_size}..{dev.info.max_subgroup_size})"
        )
    need = mf.shared_bytes(kernel, consts)
    if need > dev.info.max_shared_bytes:
        return f"needs {need} bytes of shared memory, device allows {dev.info.max_shared_bytes}"
    if kernel["workgroup_size"] > dev.info.max_workgroup_size:
        return f"workgroup {kernel['workgroup_size']} > device limit {dev.info.max_workgroup_size}"
    if "storage_buffer_16bit" in kernel["features"] and not dev.info.storage16:
        return "device lacks storageBuffer16BitAccess"
    if "atomic_float_add" in kernel["features"] and not dev.info.atomic_float:
        return "device lacks shaderBufferFloat32AtomicAdd"
    if "integer_dot_product" in kernel["features"] and not dev.info.int_dot:
        return "device lacks shaderIntegerDotProduct"
    return None


def derived_values(
    kernel: Mapping[str, Any], consts: Mapping[str, int | float]
) -> list[tuple[int, str, int | float]]:
    """The kernel's derived specialization constants at `consts`; RuntimeFailure, in one
    sentence, when the constants make its index math divide by zero."""
    try:
        return mf.derived_specs(kernel, consts)
    except ValueError as e:
        shown = ", ".join(f"{n} = {v}" for n, v in consts.items())
        raise RuntimeFailure(
            f"kernel {kernel['name']} cannot run at {shown}: its index math {e}"
        ) from None


def check_runnable(region: Mapping[str, Any], consts: Mapping[str, int | float]) -> None:
    """Refuse constants at which any kernel of the region (fused or unfused) cannot run, before
    anything runs (the numpy reference would only warn)."""
    for k in [*region["fused"], *region["unfused"]]:
        derived_values(k, consts)


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
                int(np.prod(shape_of(decl, self.consts)))
                * np.dtype(NP_DTYPES[decl["dtype"]]).itemsize
            )
            if buf.size < need:
                raise RuntimeFailure(
                    f"buffer for '{name}' of region '{region}' has {buf.size} bytes, needs {need}"
                )
        self._buffers: dict[str, DeviceBuffer] = {}
        self._pipelines: list[Pipeline] = []

    def _buffer_decls(self) -> dict[str, dict[str, Any]]:
        r = self.region
        return {b["name"]: b for b in [*r["inputs"], *r["outputs"], *r["intermediates"]]}

    def ensure_buffers(self) -> None:
        """Allocate the buffers not supplied by the caller (once)."""
        if self._buffers:
            return
        for name, decl in self._buffer_decls().items():
            if name in self._external:
                self._buffers[name] = self._external[name]
                continue
            n = int(np.prod(shape_of(decl, self.consts)))
            self._buffers[name] = DeviceBuffer(
                self.dev, n * np.dtype(NP_DTYPES[decl["dtype"]]).itemsize
            )
        params = runtime_params(self.region)
        if params:
            # host-visible: new values are written between submissions of recorded commands
            self._buffers[PARAMS_BUFFER] = DeviceBuffer(self.dev, 4 * len(params), host=True)
            self.set_params({})

    def set_params(self, values: Mapping[str, int]) -> None:
        """Set run-time parameters (e.g. `pos`) for the next submission; nothing is re-recorded."""
        params = runtime_params(self.region)
        if values:
            self.consts = const_values(
                self.region, {**{c["name"]: self.consts[c["name"]] for c in params}, **values}
            )
        if params and PARAMS_BUFFER in self._buffers:
            data = np.array([self.consts[c["name"]] for c in params], np.uint32)
            self._buffers[PARAMS_BUFFER].upload(data)

    def choose(self, fused: bool) -> tuple[str, list[dict[str, Any]]]:
        """Which product runs: ('fused', kernels), ('fallback(reason)', unfused kernels) or
        ('unfused', kernels)."""
        if not fused:
            return "unfused", self.region["unfused"]
        known = [r["name"] for r in self.build.manifest["regions"]]
        switched = kill_switch(self.region["name"], known)
        if switched is not None:
            return f"fallback({switched})", self.region["unfused"]
        if self.target is not None:
            first = self.region["fused"][0]
            if self.target_is_device:
                sub = first["subgroup"]
                wave = self.dev.subgroup_size_for(sub["kind"], sub["sizes"]) or 0
            else:
                wave = default_wave(self.target, first["workgroup_size"])
            if wave in self.target.wave_sizes:
                why = refusal(self.region, self.consts, self.target, wave, self.min_waves)
                if why is not None:
                    return f"fallback(budget: {why})", self.region["unfused"]
        for k in self.region["fused"]:
            reason = device_refusal(self.dev, k, self.consts)
            if reason is not None:
                alternate = self.region.get("fused_shared")
                if alternate and all(
                    device_refusal(self.dev, a, self.consts) is None for a in alternate
                ):
                    # the tile's group is wider than this device's subgroup: same kernel,
                    # lanes exchange through shared memory
                    return "fused(shared exchange)", alternate
                return f"fallback({reason})", self.region["unfused"]
        return "fused", self.region["fused"]

    def buffer(self, name: str) -> DeviceBuffer:
        return self._buffers[name]

    def prepare(self, inputs: Mapping[str, np.ndarray], poison: bool = True) -> None:
        """Check and upload inputs; fill outputs and intermediates with NaN."""
        check_inputs(self.region, inputs, self.consts)
        self.ensure_buffers()
        for b in [*self.region["inputs"], *state_inputs(self.region)]:
            self._buffers[b["name"]].upload(np.asarray(inputs[b["name"]]))
        if poison:
            for b in [*self.region["outputs"], *self.region["intermediates"]]:
                if b.get("state"):
                    continue  # holds its earlier contents
                shape = shape_of(b, self.consts)
                self._buffers[b["name"]].upload(poison_array(b["dtype"], shape))

    def pipelines_for(
        self, kernels: list[dict[str, Any]], sets: int = 1
    ) -> tuple[list[Pipeline], list[int]]:
        """Pipelines (descriptor set 0 bound to this runner's buffers) and subgroup sizes."""
        for k in kernels:
            reason = device_refusal(self.dev, k, self.consts)
            if reason is not None:
                raise RuntimeFailure(
                    f"kernel {k['name']} cannot run on {self.dev.info.name}: {reason}"
                )
        spec_decl: list[tuple[int, str, int | float]] = [
            (c["spec_id"], c["dtype"], self.consts[c["name"]])
            for c in self.region["consts"]
            if not c.get("runtime")
        ]
        pipelines, sizes = [], []
        for k in kernels:
            derived = derived_values(k, self.consts)
            sub = k["subgroup"]
            size = self.dev.subgroup_size_for(sub["kind"], sub["sizes"])
            assert size is not None
            required = size if self.dev.info.size_control else None
            full = (
                self.dev.info.full_subgroups
                and required is not None
                and k["workgroup_size"] % size == 0
            )
            p = Pipeline(
                self.dev,
                self.build.spv(k),
                len(k["bindings"]),
                spec_decl + derived,
                required,
                full,
                sets=sets,
            )
            p.bind(
                {
                    b["binding"]: (
                        self._buffers[b["buffer"]].handle,
                        self._buffers[b["buffer"]].size,
                    )
                    for b in k["bindings"]
                }
            )
            pipelines.append(p)
            sizes.append(size)
        return pipelines, sizes

    def record(
        self,
        cmd: Any,
        kernels: list[dict[str, Any]],
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
            touched = {id(self._buffers[b["buffer"]]) for b in k["bindings"]}
            if k.get("zero_outputs"):
                # split-K kernels add into their outputs: zero them first (a transfer, then a
                # barrier before the kernel reads them)
                for name in k["zero_outputs"]:
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
                after(dispatches, k["name"])  # e.g. a timestamp after each dispatch
            dispatches += 1
            dirty |= {id(self._buffers[b["buffer"]]) for b in k["bindings"] if b["writes"]}
        return dispatches, barriers

    def _schedule(
        self, kernels: list[dict[str, Any]], pipelines: list[Pipeline], sizes: list[int]
    ) -> list[tuple[dict[str, Any], Pipeline, int]]:
        """Kernels in dispatch order: consecutive kernels with the same `loop` id (an unfused
        repeat) run `loop_count` times."""
        items = list(zip(kernels, pipelines, sizes, strict=True))
        out: list[tuple[dict[str, Any], Pipeline, int]] = []
        i = 0
        while i < len(items):
            loop = items[i][0].get("loop")
            if loop is None:
                out.append(items[i])
                i += 1
                continue
            j = i
            while j < len(items) and items[j][0].get("loop") == loop:
                j += 1
            count = mf.eval_json(items[i][0]["loop_count"], self.consts)
            out += items[i:j] * max(count, 0)
            i = j
        return out

    def run(
        self, inputs: Mapping[str, np.ndarray], fused: bool = True, poison: bool = True
    ) -> RunResult:
        """Run one product once and download every output."""
        path, kernels = self.choose(fused)
        self.prepare(inputs, poison)
        pipelines, sizes = self.pipelines_for(kernels)
        self._pipelines.extend(pipelines)
        with one_shot(self.dev) as cmd:
            dispatches, barriers = self.record(cmd, kernels, pipelines, sizes)
        outputs = {
            b["name"]: self._buffers[b["name"]].download(
                NP_DTYPES[b["dtype"]], shape_of(b, self.consts)
            )
            for b in self.region["outputs"]
        }
        return RunResult(outputs, path, dispatches, barriers, tuple(sizes))

    def close(self) -> None:
        for p in self._pipelines:
            p.destroy()
        for name, b in self._buffers.items():
            if name not in self._external:
                b.destroy()
        self._pipelines, self._buffers = [], {}
