"""Device buffers with numpy in/out.  Device-local memory, through a host-visible staging buffer
when the device-local memory cannot be mapped (discrete GPUs); mapped directly otherwise."""

from __future__ import annotations

from typing import Any

import numpy as np

from .device import Device, RuntimeFailure


class _Raw:
    def __init__(self, dev: Device, size: int, usage: int, want: int, avoid: int = 0) -> None:
        vk = dev.vk
        self.dev, self.size = dev, size
        with dev.memory_errors(f"creating a {size}-byte buffer"):
            self.buffer = vk.vkCreateBuffer(
                dev.device,
                vk.VkBufferCreateInfo(
                    size=size, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE
                ),
                None,
            )
        try:
            self.memory = self._allocate(want, avoid)
        except BaseException:
            vk.vkDestroyBuffer(dev.device, self.buffer, None)
            raise
        try:
            with dev.memory_errors(f"binding a {size}-byte buffer"):
                vk.vkBindBufferMemory(dev.device, self.buffer, self.memory, 0)
        except BaseException:
            self.destroy()
            raise

    def _allocate(self, want: int, avoid: int) -> Any:
        dev, vk = self.dev, self.dev.vk
        req = vk.vkGetBufferMemoryRequirements(dev.device, self.buffer)
        mt = dev.memory_type(req.memoryTypeBits, want, avoid)
        if mt is None:
            mt = dev.memory_type(req.memoryTypeBits, want)
        if mt is None:
            raise RuntimeFailure(f"no suitable memory type for a {self.size}-byte buffer")
        self.host_visible = bool(
            dev.memory.memoryTypes[mt].propertyFlags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT
        )
        info = vk.VkMemoryAllocateInfo(allocationSize=req.size, memoryTypeIndex=mt)
        try:
            with dev.memory_errors(f"allocating {self.size} bytes for a buffer"):
                memory = vk.vkAllocateMemory(dev.device, info, None)
        except vk.VkError as exc:  # e.g. VkErrorTooManyObjects (maxMemoryAllocationCount)
            raise RuntimeFailure(
                f"'{dev.info.name}' cannot allocate {self.size} bytes for a buffer "
                f"({type(exc).__name__})"
            ) from None
        return memory

    def write(self, data: bytes | memoryview, pad: int = 0) -> None:
        """`data` at the buffer's start, then `pad` zero bytes."""
        vk = self.dev.vk
        n = len(data)
        with self.dev.memory_errors(f"mapping a {self.size}-byte buffer"):
            ptr = vk.vkMapMemory(self.dev.device, self.memory, 0, n + pad, 0)
        vk.ffi.memmove(ptr, data, n)
        if pad:
            ptr[n : n + pad] = bytes(pad)
        vk.vkUnmapMemory(self.dev.device, self.memory)

    def read(self, size: int) -> bytes:
        vk = self.dev.vk
        with self.dev.memory_errors(f"mapping a {self.size}-byte buffer"):
            ptr = vk.vkMapMemory(self.dev.device, self.memory, 0, size, 0)
        data = bytes(ptr[:size])
        vk.vkUnmapMemory(self.dev.device, self.memory)
        return data

    def destroy(self) -> None:
        if self.dev.closed:
            return  # gone with the device; a call on it now would abort
        vk = self.dev.vk
        vk.vkDestroyBuffer(self.dev.device, self.buffer, None)
        vk.vkFreeMemory(self.dev.device, self.memory, None)


class DeviceBuffer:
    """A storage buffer of `size` bytes (rounded up to 4)."""

    def __init__(self, dev: Device, size: int, host: bool = False) -> None:
        """`host`: in host-visible, coherent memory, so an upload is a plain write that needs
        no command buffer (parameters rewritten between submissions)."""
        dev.check_open()
        vk = dev.vk
        self.dev = dev
        self.size = max(4, (size + 3) // 4 * 4)

        usage = (
            vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT
        )
        want = (
            vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
            if host
            else vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
        )
        self.raw = _Raw(dev, self.size, usage, want)
        self.handle: Any = self.raw.buffer

    def _staging(self) -> _Raw:
        vk = self.dev.vk
        return _Raw(
            self.dev,
            self.size,
            vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT,
            vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT,
        )

    def _copy(self, src: Any, dst: Any) -> None:
        vk = self.dev.vk
        from .dispatch import one_shot

        with one_shot(self.dev) as cmd:
            vk.vkCmdCopyBuffer(cmd, src, dst, 1, [vk.VkBufferCopy(0, 0, self.size)])

    def upload(self, array: np.ndarray) -> None:
        self.dev.check_open()
        # the array's own bytes, not a copy of them (a weight of a check can be 300 MB)
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data
        pad = self.size - len(data)
        if self.raw.host_visible:
            self.raw.write(data, pad)
            return
        staging = self._staging()
        try:
            staging.write(data, pad)
            self._copy(staging.buffer, self.raw.buffer)
        finally:
            staging.destroy()

    def download(self, dtype: np.dtype[Any] | type, shape: tuple[int, ...]) -> np.ndarray:
        self.dev.check_open()
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if self.raw.host_visible:
            data = self.raw.read(n)
        else:
            staging = self._staging()
            try:
                self._copy(self.raw.buffer, staging.buffer)
                data = staging.read(n)
            finally:
                staging.destroy()
        return np.frombuffer(data, dtype=dtype).reshape(shape).copy()

    def destroy(self) -> None:
        self.raw.destroy()
