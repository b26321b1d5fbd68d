"""Vulkan device choice and setup (the `vulkan` package).

Choice: `--device NAME` (a case-insensitive substring of the device name, or its index), else the
environment variable FUSEC_DEVICE, else the first GPU, else the first CPU device (lavapipe).
Every failure is a `RuntimeFailure`: one sentence for the user, no traceback.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from fusec.dsl.diagnostics import Diagnostic, DiagnosticError

DEVICE_ENV = "FUSEC_DEVICE"
STATS_EXTENSION = "VK_KHR_pipeline_executable_properties"
ATOMIC_FLOAT_EXTENSION = "VK_EXT_shader_atomic_float"
INT_DOT_EXTENSION = "VK_KHR_shader_integer_dot_product"
CLOCK_EXTENSION = "VK_KHR_shader_clock"  # shaderDeviceClock: the persistent product's stamps
_TYPE_NAMES = {0: "other", 1: "integrated GPU", 2: "discrete GPU", 3: "virtual GPU", 4: "CPU"}


class RuntimeFailure(DiagnosticError):
    """A runtime problem (no device, bad array, device lost): one clear sentence."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__([Diagnostic(None, message, hint)])


def choice_switch(
    name: str, value: str | None, choices: Sequence[str], default: str, what: str
) -> str:
    """An environment switch with a fixed set of values: `value`, else the variable `name`,
    else `default`; anything else, an empty value of a set variable included, is refused in one
    sentence ("NAME='x' is not WHAT"), as the kill switches are, strictly."""
    if value is None:
        value = os.environ.get(name, default)
    if value not in choices:
        raise RuntimeFailure(f"{name}={value!r} is not {what}", f"use one of: {', '.join(choices)}")
    return value


def _vk() -> Any:
    try:
        import vulkan as vk
    except (ImportError, OSError) as exc:
        raise RuntimeFailure(
            f"cannot load the Vulkan loader ({exc})", "install libvulkan1 (make setup does)"
        ) from None
    return vk


@attrs.frozen
class DeviceInfo:
    index: int
    name: str
    kind: str
    subgroup_size: int
    min_subgroup_size: int
    max_subgroup_size: int
    size_control: bool  # requiredSubgroupSize usable for compute
    full_subgroups: bool
    storage16: bool
    atomic_float: bool  # shaderBufferFloat32AtomicAdd (VK_EXT_shader_atomic_float)
    int_dot: bool  # shaderIntegerDotProduct (Vulkan 1.3 core, or VK_KHR_shader_integer_dot_product)
    max_shared_bytes: int
    max_workgroup_size: int
    timestamp_period_ns: float
    api_version: int
    max_buffer_bytes: int  # maxStorageBufferRange: the most bytes one buffer binding may span
    memory_bytes: int  # the largest device-local memory heap (0: none reported, e.g. a null device)
    float64: bool = False  # shaderFloat64 (a stage computed `as f64`)
    # vulkanMemoryModel (Vulkan 1.2 core): kernels with stages in grid need it (kir.Arrive)
    memory_model: bool = False
    # shaderDeviceClock (VK_KHR_shader_clock): clockRealtimeEXT in shaders (persistent stamps)
    shader_clock: bool = False


class Device:
    """An instance, a logical device with one compute queue, and a command pool."""

    def __init__(
        self, name: str | None = None, capture_statistics: bool = True, robust: bool = False
    ) -> None:
        """`capture_statistics` enables VK_KHR_pipeline_executable_properties where the device
        offers it (`statistics` says whether it did), so that the budget gate can read the
        driver's numbers of a fused pipeline right after creating it (runtime/gate.py
        `confirm`); only fused pipelines are then created with the capture flag.
        `robust` asks for robustBufferAccess where the device has it: an access past a
        binding's range is then discarded or reads zero (Vulkan spec, "Robust Buffer Access")
        instead of touching other memory.  `fusec check` asks for it, so that even a build folder
        that passes validation with wrong bindings cannot corrupt memory; timing does not."""
        self.closed = False
        vk = self.vk = _vk()
        app = vk.VkApplicationInfo(pApplicationName="fusec", apiVersion=vk.VK_MAKE_VERSION(1, 3, 0))
        try:
            self.instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
            physical = vk.vkEnumeratePhysicalDevices(self.instance)
        except vk.VkError as exc:
            raise RuntimeFailure(
                f"no Vulkan driver could be initialized ({type(exc).__name__})",
                "install a Vulkan driver, e.g. mesa-vulkan-drivers (lavapipe)",
            ) from None
        if not physical:
            raise RuntimeFailure(
                "no Vulkan device found", "install mesa-vulkan-drivers for the lavapipe CPU device"
            )
        infos = [self._info(i, pd) for i, pd in enumerate(physical)]
        wanted = name if name is not None else os.environ.get(DEVICE_ENV) or None
        chosen = self._choose(infos, wanted)
        self.info = chosen
        self.physical = physical[chosen.index]
        self._create_device(capture_statistics, robust)

    @staticmethod
    def _choose(infos: list[DeviceInfo], wanted: str | None) -> DeviceInfo:
        if wanted:
            if wanted.isdigit() and int(wanted) < len(infos):
                return infos[int(wanted)]
            matches = [i for i in infos if wanted.lower() in i.name.lower()]
            if not matches:
                names = "; ".join(f"{i.index}: {i.name}" for i in infos)
                raise RuntimeFailure(
                    f"no Vulkan device matches '{wanted}'", f"devices here: {names}"
                )
            return matches[0]
        gpus = [i for i in infos if "GPU" in i.kind]
        return gpus[0] if gpus else infos[0]

    def _info(self, index: int, pd: Any) -> DeviceInfo:
        vk = self.vk
        props = vk.vkGetPhysicalDeviceProperties(pd)
        sg = vk.VkPhysicalDeviceSubgroupProperties()
        ssc = vk.VkPhysicalDeviceSubgroupSizeControlProperties(pNext=sg)
        vk.vkGetPhysicalDeviceProperties2(pd, vk.VkPhysicalDeviceProperties2(pNext=ssc))
        exts = {str(e.extensionName) for e in vk.vkEnumerateDeviceExtensionProperties(pd, None)}
        atomic = None
        dot = None
        if int(props.apiVersion) >= vk.VK_MAKE_VERSION(1, 3, 0) or INT_DOT_EXTENSION in exts:
            dot = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures()
        f16 = vk.VkPhysicalDevice16BitStorageFeatures(pNext=dot)
        if ATOMIC_FLOAT_EXTENSION in exts:
            atomic = vk.VkPhysicalDeviceShaderAtomicFloatFeaturesEXT(pNext=dot)
            f16 = vk.VkPhysicalDevice16BitStorageFeatures(pNext=atomic)
        vmm = None
        if int(props.apiVersion) >= vk.VK_MAKE_VERSION(1, 2, 0):
            vmm = vk.VkPhysicalDeviceVulkanMemoryModelFeatures(pNext=f16)
        clock = None
        if CLOCK_EXTENSION in exts:
            clock = vk.VkPhysicalDeviceShaderClockFeaturesKHR(pNext=vmm or f16)
        fsc = vk.VkPhysicalDeviceSubgroupSizeControlFeatures(pNext=clock or vmm or f16)
        vk.vkGetPhysicalDeviceFeatures2(pd, vk.VkPhysicalDeviceFeatures2(pNext=fsc))
        compute_ok = bool(ssc.requiredSubgroupSizeStages & vk.VK_SHADER_STAGE_COMPUTE_BIT)
        memory = vk.vkGetPhysicalDeviceMemoryProperties(pd)
        heaps = [memory.memoryHeaps[i] for i in range(memory.memoryHeapCount)]
        local = [h for h in heaps if h.flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT] or heaps
        return DeviceInfo(
            index=index,
            name=str(props.deviceName),
            kind=_TYPE_NAMES.get(int(props.deviceType), "other"),
            subgroup_size=int(sg.subgroupSize),
            min_subgroup_size=int(ssc.minSubgroupSize) or int(sg.subgroupSize),
            max_subgroup_size=int(ssc.maxSubgroupSize) or int(sg.subgroupSize),
            size_control=bool(fsc.subgroupSizeControl) and compute_ok,
            full_subgroups=bool(fsc.computeFullSubgroups),
            storage16=bool(f16.storageBuffer16BitAccess),
            atomic_float=atomic is not None and bool(atomic.shaderBufferFloat32AtomicAdd),
            int_dot=dot is not None and bool(dot.shaderIntegerDotProduct),
            max_shared_bytes=int(props.limits.maxComputeSharedMemorySize),
            max_workgroup_size=int(props.limits.maxComputeWorkGroupInvocations),
            timestamp_period_ns=float(props.limits.timestampPeriod),
            api_version=int(props.apiVersion),
            max_buffer_bytes=int(props.limits.maxStorageBufferRange),
            memory_bytes=max((int(h.size) for h in local), default=0),
            float64=bool(vk.vkGetPhysicalDeviceFeatures(pd).shaderFloat64),
            memory_model=vmm is not None and bool(vmm.vulkanMemoryModel),
            shader_clock=clock is not None and bool(clock.shaderDeviceClock),
        )

    def _create_device(self, capture_statistics: bool, robust: bool = False) -> None:
        vk = self.vk
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        family = next(
            (i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT), None
        )
        if family is None:
            raise RuntimeFailure(f"device '{self.info.name}' has no compute queue")
        self.queue_family = family
        self.timestamp_bits = int(families[family].timestampValidBits)
        f16 = vk.VkPhysicalDevice16BitStorageFeatures(
            storageBuffer16BitAccess=vk.VK_TRUE if self.info.storage16 else vk.VK_FALSE
        )
        fsc = vk.VkPhysicalDeviceSubgroupSizeControlFeatures(
            pNext=f16,
            subgroupSizeControl=vk.VK_TRUE if self.info.size_control else vk.VK_FALSE,
            computeFullSubgroups=vk.VK_TRUE if self.info.full_subgroups else vk.VK_FALSE,
        )
        extensions = []
        if self.info.api_version < vk.VK_MAKE_VERSION(1, 3, 0) and self.info.size_control:
            extensions.append("VK_EXT_subgroup_size_control")
        available = {
            str(e.extensionName)
            for e in vk.vkEnumerateDeviceExtensionProperties(self.physical, None)
        }
        self.statistics = capture_statistics and STATS_EXTENSION in available
        if self.info.atomic_float:
            extensions.append(ATOMIC_FLOAT_EXTENSION)
            fsc = vk.VkPhysicalDeviceShaderAtomicFloatFeaturesEXT(
                pNext=fsc, shaderBufferFloat32AtomicAdd=vk.VK_TRUE
            )
        if self.info.int_dot:
            if self.info.api_version < vk.VK_MAKE_VERSION(1, 3, 0):
                extensions.append(INT_DOT_EXTENSION)
            fsc = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures(
                pNext=fsc, shaderIntegerDotProduct=vk.VK_TRUE
            )
        if self.info.memory_model:
            fsc = vk.VkPhysicalDeviceVulkanMemoryModelFeatures(
                pNext=fsc, vulkanMemoryModel=vk.VK_TRUE
            )
        if self.info.shader_clock:
            extensions.append(CLOCK_EXTENSION)
            fsc = vk.VkPhysicalDeviceShaderClockFeaturesKHR(pNext=fsc, shaderDeviceClock=vk.VK_TRUE)
        if self.statistics:
            extensions.append(STATS_EXTENSION)
            fsc = vk.VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR(
                pNext=fsc, pipelineExecutableInfo=vk.VK_TRUE
            )
        queue_info = vk.VkDeviceQueueCreateInfo(
            queueFamilyIndex=family, queueCount=1, pQueuePriorities=[1.0]
        )
        self.robust = robust and bool(
            vk.vkGetPhysicalDeviceFeatures(self.physical).robustBufferAccess
        )
        features = vk.VkPhysicalDeviceFeatures(
            robustBufferAccess=vk.VK_TRUE if self.robust else vk.VK_FALSE,
            shaderFloat64=vk.VK_TRUE if self.info.float64 else vk.VK_FALSE,
        )
        info = vk.VkDeviceCreateInfo(
            pNext=fsc,
            queueCreateInfoCount=1,
            pQueueCreateInfos=[queue_info],
            enabledExtensionCount=len(extensions),
            ppEnabledExtensionNames=extensions or None,
            pEnabledFeatures=features,
        )
        try:
            self.device = vk.vkCreateDevice(self.physical, info, None)
        except vk.VkError as exc:
            raise RuntimeFailure(
                f"cannot create a Vulkan device on '{self.info.name}' ({type(exc).__name__})"
            ) from None
        self.queue = vk.vkGetDeviceQueue(self.device, family, 0)
        self.command_pool = vk.vkCreateCommandPool(
            self.device,
            vk.VkCommandPoolCreateInfo(
                queueFamilyIndex=family, flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT
            ),
            None,
        )
        self.memory = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        self.submitted = False

    def memory_type(self, bits: int, want: int, avoid: int = 0) -> int | None:
        for i in range(self.memory.memoryTypeCount):
            flags = self.memory.memoryTypes[i].propertyFlags
            if bits & (1 << i) and (flags & want) == want and not flags & avoid:
                return i
        return None

    def subgroup_size_for(self, allowed_kind: str, sizes: Sequence[int]) -> int | None:
        """The subgroup size a kernel gets here: the device default if allowed, else the largest
        allowed size the device can be asked for; None when no allowed size is possible."""
        from fusec.dsl.ir import SubgroupReq

        req = SubgroupReq(allowed_kind, tuple(sizes))
        if req.allows(self.info.subgroup_size):
            return self.info.subgroup_size
        if not self.info.size_control:
            return None
        s, options = self.info.min_subgroup_size, []
        while s <= self.info.max_subgroup_size:
            if req.allows(s):
                options.append(s)
            s *= 2
        return max(options) if options else None

    def check_open(self) -> None:
        """Refuse use after `close`: a Vulkan call on a destroyed device aborts the interpreter,
        so every entry point (runners, buffers, pipelines, submissions) asks first."""
        if self.closed:
            raise RuntimeFailure(
                f"the Vulkan device '{self.info.name}' is closed",
                "run regions inside `with Device() as dev:`, or open a new Device",
            )

    @contextlib.contextmanager
    def memory_errors(self, doing: str) -> Iterator[None]:
        """Vulkan's out-of-memory errors while `doing` (e.g. "allocating 8 bytes") as one
        sentence."""
        vk = self.vk
        try:
            yield
        except vk.VkErrorOutOfDeviceMemory:
            raise RuntimeFailure(
                f"'{self.info.name}' ran out of device memory {doing}",
                "choose smaller constants, or close programs that hold device memory",
            ) from None
        except vk.VkErrorOutOfHostMemory:
            raise RuntimeFailure(
                f"'{self.info.name}' ran out of host memory {doing}",
                "choose smaller constants, or close programs that hold memory",
            ) from None

    def close(self) -> None:
        """Destroy the device.  Buffers and pipelines made from it should be destroyed first;
        destroying them afterwards does nothing (a call on a destroyed device aborts), and any
        other use afterwards is refused (`check_open`)."""
        self.closed = True
        vk = self.vk
        if getattr(self, "device", None) is not None:
            if self.submitted:  # RADV's null device crashes in vkDeviceWaitIdle; it never runs
                vk.vkDeviceWaitIdle(self.device)
            vk.vkDestroyCommandPool(self.device, self.command_pool, None)
            vk.vkDestroyDevice(self.device, None)
            self.device = None
        if getattr(self, "instance", None) is not None:
            vk.vkDestroyInstance(self.instance, None)
            self.instance = None

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
