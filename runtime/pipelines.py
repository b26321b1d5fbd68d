"""Compute pipelines from prebuilt SPIR-V: descriptor layout, specialization constants and,
where the layout needs it, a required subgroup size (VK_EXT_subgroup_size_control, core 1.3)."""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from .device import Device, RuntimeFailure

# VkPipelineShaderStageCreateFlagBits (Vulkan 1.3 spec); the vulkan package binds it as None
REQUIRE_FULL_SUBGROUPS_BIT = 0x2
CAPTURE_STATISTICS_BIT = 0x40  # VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR


class Pipeline:
    def __init__(
        self,
        dev: Device,
        spv: bytes,
        n_bindings: int,
        spec: list[tuple[int, str, int | float]],  # (constant_id, dtype, value)
        subgroup_size: int | None,
        full_subgroups: bool,
        capture_statistics: bool = False,
        sets: int = 1,
    ) -> None:
        """`sets` descriptor sets are allocated (several when weights rotate among copies)."""
        dev.check_open()
        self.vk = dev.vk
        self.dev = dev
        self.module: Any = None
        self.set_layout: Any = None
        self.layout: Any = None
        self.pipeline: Any = None
        self.pool: Any = None
        try:
            with dev.memory_errors("creating a pipeline"):
                self._create(
                    spv, n_bindings, spec, subgroup_size, full_subgroups, capture_statistics, sets
                )
        except BaseException:
            self.destroy()  # what was made before the failure
            raise

    def _create(
        self,
        spv: bytes,
        n_bindings: int,
        spec: list[tuple[int, str, int | float]],
        subgroup_size: int | None,
        full_subgroups: bool,
        capture_statistics: bool,
        sets: int,
    ) -> None:
        vk = self.vk
        d = self.dev.device
        self.module = vk.vkCreateShaderModule(
            d, vk.VkShaderModuleCreateInfo(codeSize=len(spv), pCode=spv), None
        )
        bindings = [
            vk.VkDescriptorSetLayoutBinding(
                binding=i,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                descriptorCount=1,
                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            )
            for i in range(n_bindings)
        ]
        self.set_layout = vk.vkCreateDescriptorSetLayout(
            d,
            vk.VkDescriptorSetLayoutCreateInfo(bindingCount=len(bindings), pBindings=bindings),
            None,
        )
        self.layout = vk.vkCreatePipelineLayout(
            d, vk.VkPipelineLayoutCreateInfo(setLayoutCount=1, pSetLayouts=[self.set_layout]), None
        )
        data = b"".join(
            struct.pack("<I", int(v)) if dt in ("u32", "i32") else struct.pack("<f", float(v))
            for _, dt, v in spec
        )
        entries = [
            vk.VkSpecializationMapEntry(constantID=cid, offset=4 * i, size=4)
            for i, (cid, _, _) in enumerate(spec)
        ]
        self._spec_data = vk.ffi.new("char[]", data or b"\0")
        spec_info = vk.VkSpecializationInfo(
            mapEntryCount=len(entries),
            pMapEntries=entries or None,
            dataSize=len(data),
            pData=self._spec_data,
        )
        stage_next = None
        flags = 0
        if subgroup_size is not None:
            stage_next = vk.VkPipelineShaderStageRequiredSubgroupSizeCreateInfo(
                requiredSubgroupSize=subgroup_size
            )
            if full_subgroups:
                flags |= REQUIRE_FULL_SUBGROUPS_BIT
        stage = vk.VkPipelineShaderStageCreateInfo(
            pNext=stage_next,
            flags=flags,
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT,
            module=self.module,
            pName="main",
            pSpecializationInfo=spec_info,
        )
        try:
            self.pipeline = vk.vkCreateComputePipelines(
                d,
                None,
                1,
                [
                    vk.VkComputePipelineCreateInfo(
                        flags=CAPTURE_STATISTICS_BIT if capture_statistics else 0,
                        stage=stage,
                        layout=self.layout,
                    )
                ],
                None,
            )[0]
        except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory):
            raise  # said in one sentence by Device.memory_errors
        except vk.VkError as exc:
            raise RuntimeFailure(
                f"the driver refused to create a pipeline ({type(exc).__name__})"
            ) from None
        pool_size = vk.VkDescriptorPoolSize(
            type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=max(1, n_bindings) * sets
        )
        self.pool = vk.vkCreateDescriptorPool(
            d,
            vk.VkDescriptorPoolCreateInfo(maxSets=sets, poolSizeCount=1, pPoolSizes=[pool_size]),
            None,
        )
        self.sets = list(
            vk.vkAllocateDescriptorSets(
                d,
                vk.VkDescriptorSetAllocateInfo(
                    descriptorPool=self.pool,
                    descriptorSetCount=sets,
                    pSetLayouts=[self.set_layout] * sets,
                ),
            )
        )
        self.set = self.sets[0]

    def bind(self, buffers: Mapping[int, Any], set_index: int = 0) -> None:
        """Point binding i at buffers[i] = (handle, size in bytes), in descriptor set
        `set_index`."""
        vk = self.vk
        writes = [
            vk.VkWriteDescriptorSet(
                dstSet=self.sets[set_index],
                dstBinding=i,
                descriptorCount=1,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                pBufferInfo=[vk.VkDescriptorBufferInfo(buffer=h, offset=0, range=size)],
            )
            for i, (h, size) in buffers.items()
        ]
        vk.vkUpdateDescriptorSets(self.dev.device, len(writes), writes, 0, None)

    def destroy(self) -> None:
        if self.dev.closed:
            return  # gone with the device; a call on it now would abort
        vk, d = self.vk, self.dev.device
        if self.pool is not None:
            vk.vkDestroyDescriptorPool(d, self.pool, None)
        if self.pipeline is not None:
            vk.vkDestroyPipeline(d, self.pipeline, None)
        if self.layout is not None:
            vk.vkDestroyPipelineLayout(d, self.layout, None)
        if self.set_layout is not None:
            vk.vkDestroyDescriptorSetLayout(d, self.set_layout, None)
        if self.module is not None:
            vk.vkDestroyShaderModule(d, self.module, None)
        self.module = self.set_layout = self.layout = self.pipeline = self.pool = None


def check_spirv(spv: bytes, name: str) -> None:
    if len(spv) < 20 or spv[:4] != b"\x03\x02\x23\x07":
        raise RuntimeFailure(f"{name} is not a SPIR-V module", "rebuild with fusec build")


def pipeline_statistics(dev: Device, pipeline: Pipeline) -> dict[str, float]:
    """The driver's statistics of a pipeline created with capture_statistics
    (VK_KHR_pipeline_executable_properties): e.g. RADV `VGPRs`, `Pre-Sched VGPRs`, NVIDIA
    `Register Count`.  Empty when the device does not report them."""
    vk = dev.vk
    if not getattr(dev, "statistics", False):
        return {}
    get_props = vk.vkGetDeviceProcAddr(dev.device, "vkGetPipelineExecutablePropertiesKHR")
    get_stats = vk.vkGetDeviceProcAddr(dev.device, "vkGetPipelineExecutableStatisticsKHR")
    info = vk.VkPipelineInfoKHR(pipeline=pipeline.pipeline)
    out: dict[str, float] = {}
    for index, _ in enumerate(list(get_props(dev.device, info))):
        exe = vk.VkPipelineExecutableInfoKHR(pipeline=pipeline.pipeline, executableIndex=index)
        for st in get_stats(dev.device, exe):
            name = vk.ffi.string(st.name).decode() if not isinstance(st.name, str) else st.name
            fmt = st.format
            if fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
                value = float(st.value.b32)
            elif fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
                value = float(st.value.i64)
            elif fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
                value = float(st.value.u64)
            else:
                value = float(st.value.f64)
            out[name] = value
    return out
