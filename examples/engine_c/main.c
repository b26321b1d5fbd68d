/* An engine's view of fusec: run one region from a header that `fusec export` wrote, with the
 * Vulkan API only (no Python, no build folder at run time).
 *
 *   engine_c [--unfused] [-c NAME=VALUE]... INPUT.bin... OUTPUT.bin...
 *
 * The region is rms_norm_mul_matvec unless FUSEC_REGION names another at compile time
 * (-DFUSEC_REGION=fusec_region_<name>).  Its inputs are read from raw little-endian files, in the
 * region's order (x: f32[K], g: f32[K], W: f16[N, K] for rms_norm_mul_matvec), each exactly
 * the size the constants give; its outputs (y: f32[N]) are written the same way.  Constants
 * (-c K=1000) become specialization constants: no rebuild.  The program runs the fused
 * product, or the unfused chain with --unfused or where the device cannot run the fused one
 * (as fusec's runtime falls back), on the first physical device, and prints what ran.
 *
 * Every Vulkan call's result is checked; a failure exits 1 with one line on stderr.
 * examples/engine_c/README.md shows how to build it; docs/ENGINE.md describes the header.
 */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vulkan/vulkan.h>

#include "fusec_kernels.h"

#ifndef FUSEC_REGION
#define FUSEC_REGION fusec_region_rms_norm_mul_matvec
#endif

#define MAX_BUFFERS 64
#define MAX_STEPS 256
#define MAX_DISPATCHES 65536

static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "engine_c: error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

#define VK_CHECK(call)                                                                     \
    do {                                                                                   \
        VkResult vk_result_ = (call);                                                      \
        if (vk_result_ != VK_SUCCESS) die("%s failed (VkResult %d)", #call, (int)vk_result_); \
    } while (0)

/* ---- the device ---- */

typedef struct device {
    VkInstance instance;
    VkPhysicalDevice physical;
    VkDevice device;
    VkQueue queue;
    uint32_t queue_family;
    char name[VK_MAX_PHYSICAL_DEVICE_NAME_SIZE];
    uint32_t api_version;
    uint32_t subgroup_size, min_subgroup_size, max_subgroup_size;
    int size_control, full_subgroups;
    uint32_t features; /* FUSEC_FEATURE_* the device offers */
    int has_size_control_ext, has_int_dot_ext, has_atomic_float_ext;
    VkPhysicalDeviceLimits limits;
    VkPhysicalDeviceMemoryProperties memory;
} device;

static int has_extension(VkPhysicalDevice pd, const char *name)
{
    uint32_t n = 0, i;
    int found = 0;
    VkExtensionProperties *props;
    VK_CHECK(vkEnumerateDeviceExtensionProperties(pd, NULL, &n, NULL));
    props = calloc(n ? n : 1, sizeof *props);
    if (!props) die("out of host memory");
    VK_CHECK(vkEnumerateDeviceExtensionProperties(pd, NULL, &n, props));
    for (i = 0; i < n; ++i)
        if (strcmp(props[i].extensionName, name) == 0) found = 1;
    free(props);
    return found;
}

/* What the first physical device offers: subgroup sizes, size control, the features fusec
   kernels may need (the same queries as runtime/device.py). */
static void open_instance(device *d)
{
    VkApplicationInfo app = {.sType = VK_STRUCTURE_TYPE_APPLICATION_INFO};
    VkInstanceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO};
    VkPhysicalDevice devices[16];
    uint32_t count = 16;
    VkPhysicalDeviceProperties props;
    VkPhysicalDeviceSubgroupProperties sg = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES};
    VkPhysicalDeviceSubgroupSizeControlProperties ssc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES};
    VkPhysicalDeviceProperties2 props2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2};
    VkPhysicalDevice16BitStorageFeatures f16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
    VkPhysicalDeviceSubgroupSizeControlFeatures fsc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES};
    VkPhysicalDeviceShaderIntegerDotProductFeatures dot = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
    VkPhysicalDeviceShaderAtomicFloatFeaturesEXT atomic = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT};
    VkPhysicalDeviceVulkanMemoryModelFeatures vmm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES};
    VkPhysicalDeviceFeatures2 features2 = {.sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2};
    VkResult r;
    int is13;

    app.pApplicationName = "fusec engine_c";
    app.apiVersion = VK_API_VERSION_1_3;
    info.pApplicationInfo = &app;
    VK_CHECK(vkCreateInstance(&info, NULL, &d->instance));
    r = vkEnumeratePhysicalDevices(d->instance, &count, devices);
    if (r != VK_SUCCESS && r != VK_INCOMPLETE)
        die("vkEnumeratePhysicalDevices failed (VkResult %d)", (int)r);
    if (count == 0) die("no Vulkan device found (install mesa-vulkan-drivers for lavapipe)");
    d->physical = devices[0]; /* the default device: the first */

    vkGetPhysicalDeviceProperties(d->physical, &props);
    d->api_version = props.apiVersion;
    d->limits = props.limits;
    memcpy(d->name, props.deviceName, sizeof d->name);
    if (props.apiVersion < VK_API_VERSION_1_1)
        die("device '%s' supports only Vulkan 1.0; fusec kernels need 1.1", d->name);
    is13 = props.apiVersion >= VK_API_VERSION_1_3;
    d->has_size_control_ext = !is13 && has_extension(d->physical, "VK_EXT_subgroup_size_control");
    d->has_int_dot_ext = !is13 && has_extension(d->physical, "VK_KHR_shader_integer_dot_product");
    d->has_atomic_float_ext = has_extension(d->physical, "VK_EXT_shader_atomic_float");

    /* properties: subgroup size, and the sizes a pipeline may require */
    props2.pNext = &sg;
    if (is13 || d->has_size_control_ext) sg.pNext = &ssc;
    vkGetPhysicalDeviceProperties2(d->physical, &props2);
    d->subgroup_size = sg.subgroupSize;
    d->min_subgroup_size = ssc.minSubgroupSize ? ssc.minSubgroupSize : sg.subgroupSize;
    d->max_subgroup_size = ssc.maxSubgroupSize ? ssc.maxSubgroupSize : sg.subgroupSize;

    /* features, chained only where the device knows the structure */
    features2.pNext = &f16;
    if (is13 || d->has_size_control_ext) { fsc.pNext = features2.pNext; features2.pNext = &fsc; }
    if (is13 || d->has_int_dot_ext) { dot.pNext = features2.pNext; features2.pNext = &dot; }
    if (d->has_atomic_float_ext) { atomic.pNext = features2.pNext; features2.pNext = &atomic; }
    if (props.apiVersion >= VK_API_VERSION_1_2) { vmm.pNext = features2.pNext; features2.pNext = &vmm; }
    vkGetPhysicalDeviceFeatures2(d->physical, &features2);
    /* a stage may require a subgroup size only if requiredSubgroupSizeStages has it (Vulkan
       1.3 spec, VkPipelineShaderStageCreateInfo valid usage), and the size must be a power of
       two from minSubgroupSize to maxSubgroupSize (VUID-VkPipelineShaderStageRequired
       SubgroupSizeCreateInfo-requiredSubgroupSize-02760..02762), as fusec_subgroup_size picks */
    d->size_control = fsc.subgroupSizeControl &&
                      (ssc.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT);
    d->full_subgroups = fsc.computeFullSubgroups != 0;
    d->features = (f16.storageBuffer16BitAccess ? FUSEC_FEATURE_STORAGE_BUFFER_16BIT : 0u) |
                  (atomic.shaderBufferFloat32AtomicAdd ? FUSEC_FEATURE_ATOMIC_FLOAT_ADD : 0u) |
                  (dot.shaderIntegerDotProduct ? FUSEC_FEATURE_INTEGER_DOT_PRODUCT : 0u) |
                  (features2.features.shaderFloat64 ? FUSEC_FEATURE_FLOAT64 : 0u) |
                  (vmm.vulkanMemoryModel ? FUSEC_FEATURE_VULKAN_MEMORY_MODEL : 0u);
    vkGetPhysicalDeviceMemoryProperties(d->physical, &d->memory);
}

/* A logical device with one compute queue and the features `needed` (FUSEC_FEATURE_*). */
static void open_device(device *d, uint32_t needed)
{
    VkQueueFamilyProperties families[32];
    uint32_t n = 32, i;
    float priority = 1.0f;
    const char *extensions[4];
    uint32_t n_ext = 0;
    VkDeviceQueueCreateInfo queue = {.sType = VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO};
    VkDeviceCreateInfo info = {.sType = VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO};
    VkPhysicalDeviceFeatures core = {0};
    VkPhysicalDevice16BitStorageFeatures f16 = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_16BIT_STORAGE_FEATURES};
    VkPhysicalDeviceSubgroupSizeControlFeatures fsc = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES};
    VkPhysicalDeviceShaderIntegerDotProductFeatures dot = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_FEATURES};
    VkPhysicalDeviceShaderAtomicFloatFeaturesEXT atomic = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT};
    VkPhysicalDeviceVulkanMemoryModelFeatures vmm = {
        .sType = VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_MEMORY_MODEL_FEATURES};
    void *chain = NULL; /* the feature structures, each prepended */

    vkGetPhysicalDeviceQueueFamilyProperties(d->physical, &n, families);
    for (i = 0; i < n && !(families[i].queueFlags & VK_QUEUE_COMPUTE_BIT); ++i) {}
    if (i == n) die("device '%s' has no compute queue", d->name);
    d->queue_family = i;
    queue.queueFamilyIndex = i;
    queue.queueCount = 1;
    queue.pQueuePriorities = &priority;

    if (needed & FUSEC_FEATURE_STORAGE_BUFFER_16BIT) {
        f16.storageBuffer16BitAccess = VK_TRUE;
        f16.pNext = chain;
        chain = &f16;
    }
    if (d->size_control) {
        fsc.subgroupSizeControl = VK_TRUE;
        fsc.computeFullSubgroups = d->full_subgroups ? VK_TRUE : VK_FALSE;
        fsc.pNext = chain;
        chain = &fsc;
        if (d->has_size_control_ext) extensions[n_ext++] = "VK_EXT_subgroup_size_control";
    }
    if (needed & FUSEC_FEATURE_INTEGER_DOT_PRODUCT) {
        dot.shaderIntegerDotProduct = VK_TRUE;
        dot.pNext = chain;
        chain = &dot;
        if (d->has_int_dot_ext) extensions[n_ext++] = "VK_KHR_shader_integer_dot_product";
    }
    if (needed & FUSEC_FEATURE_ATOMIC_FLOAT_ADD) {
        atomic.shaderBufferFloat32AtomicAdd = VK_TRUE;
        atomic.pNext = chain;
        chain = &atomic;
        extensions[n_ext++] = "VK_EXT_shader_atomic_float";
    }
    if (needed & FUSEC_FEATURE_VULKAN_MEMORY_MODEL) {
        vmm.vulkanMemoryModel = VK_TRUE;
        vmm.pNext = chain;
        chain = &vmm;
    }
    core.shaderFloat64 = (needed & FUSEC_FEATURE_FLOAT64) ? VK_TRUE : VK_FALSE;
    info.pEnabledFeatures = &core;
    info.pNext = chain;
    info.queueCreateInfoCount = 1;
    info.pQueueCreateInfos = &queue;
    info.enabledExtensionCount = n_ext;
    info.ppEnabledExtensionNames = n_ext ? extensions : NULL;
    VK_CHECK(vkCreateDevice(d->physical, &info, NULL, &d->device));
    vkGetDeviceQueue(d->device, d->queue_family, 0, &d->queue);
}

/* ---- choosing the product ---- */

/* Why the device cannot run kernel `k` at constants `c` (NULL when it can); sets *size to the
   subgroup size it will run at. */
static const char *refusal(const device *d, const fusec_kernel *k, const fusec_value *c,
                           uint32_t *size)
{
    *size = fusec_subgroup_size(k, d->subgroup_size, d->min_subgroup_size, d->max_subgroup_size,
                                d->size_control);
    if (*size == 0) return "its subgroup sizes are unavailable on this device";
    if (k->local_size[0] < *size) return "its workgroup is smaller than the subgroup";
    if (k->local_size[0] > d->limits.maxComputeWorkGroupInvocations)
        return "its workgroup is larger than the device allows";
    if (k->shared_bytes(c) > d->limits.maxComputeSharedMemorySize)
        return "it needs more shared memory than the device has";
    if ((k->features & d->features) != k->features)
        return "it needs a device feature this device lacks";
    return NULL;
}

static const char *product_refusal(const device *d, const fusec_step *steps, uint32_t n,
                                   const fusec_value *c)
{
    uint32_t i, size;
    for (i = 0; i < n; ++i) {
        const char *why = refusal(d, steps[i].kernel, c, &size);
        if (why) return why;
    }
    return NULL;
}

/* ---- buffers ---- */

typedef struct buffer {
    VkBuffer handle;
    VkDeviceMemory memory;
    VkDeviceSize size;
    void *mapped;
} buffer;

/* A host-visible, coherent storage buffer (simple, and on every device: an engine would use
   device-local memory and a staging copy on a discrete GPU). */
static void make_buffer(const device *d, VkDeviceSize bytes, buffer *b)
{
    VkBufferCreateInfo info = {.sType = VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO};
    VkMemoryAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO};
    VkMemoryRequirements req;
    VkMemoryPropertyFlags want = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT |
                                 VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    uint32_t i;
    b->size = (bytes + 3u) / 4u * 4u;
    if (b->size == 0) b->size = 4;
    info.size = b->size;
    info.usage = VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_DST_BIT;
    info.sharingMode = VK_SHARING_MODE_EXCLUSIVE;
    VK_CHECK(vkCreateBuffer(d->device, &info, NULL, &b->handle));
    vkGetBufferMemoryRequirements(d->device, b->handle, &req);
    for (i = 0; i < d->memory.memoryTypeCount; ++i)
        if ((req.memoryTypeBits >> i & 1u) &&
            (d->memory.memoryTypes[i].propertyFlags & want) == want)
            break;
    if (i == d->memory.memoryTypeCount) die("no host-visible coherent memory type");
    alloc.allocationSize = req.size;
    alloc.memoryTypeIndex = i;
    VK_CHECK(vkAllocateMemory(d->device, &alloc, NULL, &b->memory));
    VK_CHECK(vkBindBufferMemory(d->device, b->handle, b->memory, 0));
    VK_CHECK(vkMapMemory(d->device, b->memory, 0, VK_WHOLE_SIZE, 0, &b->mapped));
}

static void read_file(const char *path, void *dst, uint64_t bytes)
{
    FILE *f = fopen(path, "rb");
    long size;
    if (!f) die("cannot read %s: %s", path, strerror(errno));
    if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0)
        die("cannot read %s: %s", path, strerror(errno));
    if ((uint64_t)size != bytes)
        die("%s has %ld bytes; the region needs %llu at these constants", path, size,
            (unsigned long long)bytes);
    if (bytes && fread(dst, 1, (size_t)bytes, f) != bytes) die("cannot read %s", path);
    fclose(f);
}

static void write_file(const char *path, const void *src, uint64_t bytes)
{
    FILE *f = fopen(path, "wb");
    if (!f) die("cannot write %s: %s", path, strerror(errno));
    if ((bytes && fwrite(src, 1, (size_t)bytes, f) != bytes) || fclose(f) != 0)
        die("cannot write %s: %s", path, strerror(errno));
}

/* NAME=VALUE into the region's constants (u32, i32 or f32), refused in one line otherwise. */
static void set_const(const fusec_region *r, fusec_value *c, const char *item)
{
    char name[130];
    const char *eq = strchr(item, '=');
    char *end;
    int i;
    if (!eq || eq == item || (size_t)(eq - item) >= sizeof name)
        die("-c takes NAME=VALUE, not '%s'", item);
    memcpy(name, item, (size_t)(eq - item));
    name[eq - item] = '\0';
    i = fusec_find_const(r, name);
    if (i < 0) die("region '%s' has no constant '%s'", r->name, name);
    errno = 0;
    switch (r->consts[i].dtype) {
    case FUSEC_DTYPE_F32: c[i].f = strtof(eq + 1, &end); break;
    case FUSEC_DTYPE_I32: {
        long v = strtol(eq + 1, &end, 10);
        if (v < INT32_MIN || v > INT32_MAX) errno = ERANGE;
        c[i].i = (int32_t)v;
        break;
    }
    default: {
        unsigned long long v = strtoull(eq + 1, &end, 10);
        if (v > UINT32_MAX || eq[1] == '-') errno = ERANGE;
        c[i].u = (uint32_t)v;
        break;
    }
    }
    if (errno || end == eq + 1 || *end) die("constant '%s' cannot be '%s'", name, eq + 1);
}

/* ---- pipelines and the run ---- */

typedef struct pipeline {
    VkShaderModule module;
    VkDescriptorSetLayout set_layout;
    VkPipelineLayout layout;
    VkPipeline pipeline;
    VkDescriptorSet set;
    uint32_t subgroup_size;
} pipeline;

static void make_pipeline(const device *d, const fusec_kernel *k, const fusec_value *c,
                          VkDescriptorPool pool, const buffer *buffers, pipeline *p)
{
    VkShaderModuleCreateInfo module = {.sType = VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
    VkDescriptorSetLayoutBinding bindings[64];
    VkDescriptorSetLayoutCreateInfo set_info = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
    VkPipelineLayoutCreateInfo layout = {.sType = VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
    VkSpecializationMapEntry entries[256];
    uint32_t words[256];
    VkSpecializationInfo spec;
    VkPipelineShaderStageRequiredSubgroupSizeCreateInfo required = {
        .sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO};
    VkComputePipelineCreateInfo info = {.sType = VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
    VkDescriptorSetAllocateInfo alloc = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO};
    VkDescriptorBufferInfo buffer_infos[64];
    VkWriteDescriptorSet writes[64];
    uint32_t i;

    if (k->binding_count > 64 || k->spec_count > 256) die("kernel %s is too large", k->name);
    if (refusal(d, k, c, &p->subgroup_size)) die("kernel %s cannot run here", k->name);
    module.codeSize = 4u * k->spv_words;
    module.pCode = k->spv;
    VK_CHECK(vkCreateShaderModule(d->device, &module, NULL, &p->module));

    for (i = 0; i < k->binding_count; ++i) {
        VkDescriptorSetLayoutBinding b = {0};
        b.binding = k->bindings[i].binding;
        b.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        b.descriptorCount = 1;
        b.stageFlags = VK_SHADER_STAGE_COMPUTE_BIT;
        bindings[i] = b;
    }
    set_info.bindingCount = k->binding_count;
    set_info.pBindings = bindings;
    VK_CHECK(vkCreateDescriptorSetLayout(d->device, &set_info, NULL, &p->set_layout));
    layout.setLayoutCount = 1;
    layout.pSetLayouts = &p->set_layout;
    layout.pushConstantRangeCount = 0; /* k->push_constant_bytes is 0 for fusec kernels */
    VK_CHECK(vkCreatePipelineLayout(d->device, &layout, NULL, &p->layout));

    /* specialization constants: the region's constants and the kernel's derived ones */
    fusec_spec_words(k, c, words);
    for (i = 0; i < k->spec_count; ++i) {
        entries[i].constantID = k->specs[i].id;
        entries[i].offset = 4u * i;
        entries[i].size = 4;
    }
    spec.mapEntryCount = k->spec_count;
    spec.pMapEntries = entries;
    spec.dataSize = 4u * k->spec_count;
    spec.pData = words;

    info.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    info.stage.module = p->module;
    info.stage.pName = k->entry_point;
    info.stage.pSpecializationInfo = &spec;
    if (d->size_control) {
        /* as fusec's runtime: require the chosen size wherever the device lets us, and full
           subgroups where the workgroup is a whole number of them (Vulkan 1.3 spec,
           VkPipelineShaderStageCreateInfo: REQUIRE_FULL_SUBGROUPS needs computeFullSubgroups,
           and with a required size the local size X must be a multiple of it) */
        required.requiredSubgroupSize = p->subgroup_size;
        info.stage.pNext = &required;
        if (d->full_subgroups && k->local_size[0] % p->subgroup_size == 0)
            info.stage.flags |= VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT;
    }
    info.layout = p->layout;
    VK_CHECK(vkCreateComputePipelines(d->device, VK_NULL_HANDLE, 1, &info, NULL, &p->pipeline));

    alloc.descriptorPool = pool;
    alloc.descriptorSetCount = 1;
    alloc.pSetLayouts = &p->set_layout;
    VK_CHECK(vkAllocateDescriptorSets(d->device, &alloc, &p->set));
    for (i = 0; i < k->binding_count; ++i) {
        const buffer *b = &buffers[k->bindings[i].buffer_index];
        VkWriteDescriptorSet w = {.sType = VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
        buffer_infos[i].buffer = b->handle;
        buffer_infos[i].offset = 0;
        buffer_infos[i].range = b->size;
        w.dstSet = p->set;
        w.dstBinding = k->bindings[i].binding;
        w.descriptorCount = 1;
        w.descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
        w.pBufferInfo = &buffer_infos[i];
        writes[i] = w;
    }
    vkUpdateDescriptorSets(d->device, k->binding_count, writes, 0, NULL);
}

static void barrier(VkCommandBuffer cmd, VkPipelineStageFlags src_stage, VkAccessFlags src)
{
    VkMemoryBarrier b = {.sType = VK_STRUCTURE_TYPE_MEMORY_BARRIER};
    b.srcAccessMask = src;
    b.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
    vkCmdPipelineBarrier(cmd, src_stage, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &b, 0, NULL,
                         0, NULL);
}

int main(int argc, char **argv)
{
    const fusec_region *r = &FUSEC_REGION;
    fusec_value c[256];
    device d;
    const char *files[MAX_BUFFERS];
    uint32_t n_files = 0, n_in = 0, n_out = 0, i, s;
    int unfused = 0;
    const fusec_step *steps;
    uint32_t n_steps;
    const char *why;
    char path[256] = "fused";
    buffer buffers[MAX_BUFFERS];
    pipeline pipelines[MAX_STEPS];
    VkDescriptorPool pool;
    VkDescriptorPoolSize pool_size;
    VkDescriptorPoolCreateInfo pool_info = {.sType = VK_STRUCTURE_TYPE_DESCRIPTOR_POOL_CREATE_INFO};
    VkCommandPoolCreateInfo cmd_pool_info = {.sType = VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
    VkCommandBufferAllocateInfo cmd_info = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    VkCommandBufferBeginInfo begin = {.sType = VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
    VkSubmitInfo submit = {.sType = VK_STRUCTURE_TYPE_SUBMIT_INFO};
    VkFenceCreateInfo fence_info = {.sType = VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
    VkCommandPool cmd_pool;
    VkCommandBuffer cmd;
    VkFence fence;
    uint32_t needed = 0, dispatches = 0, barriers = 0, total_bindings = 0;

    memset(&d, 0, sizeof d);
    if (r->const_count > 256 || r->buffer_count > MAX_BUFFERS) die("region %s is too large", r->name);
    for (i = 0; i < r->const_count; ++i) c[i] = r->defaults[i];
    for (i = 0; i < r->buffer_count; ++i) {
        if (r->buffers[i].kind == FUSEC_BUFFER_INPUT) n_in++;
        if (r->buffers[i].kind == FUSEC_BUFFER_OUTPUT) n_out++;
        if (r->buffers[i].state) die("region %s keeps state; this example runs stateless ones", r->name);
    }
    for (i = 1; i < (uint32_t)argc; ++i) {
        if (strcmp(argv[i], "--unfused") == 0) {
            unfused = 1;
        } else if (strcmp(argv[i], "-c") == 0 && i + 1 < (uint32_t)argc) {
            set_const(r, c, argv[++i]);
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            die("unknown option %s (usage: engine_c [--unfused] [-c NAME=VALUE]... INPUTS... "
                "OUTPUTS...)", argv[i]);
        } else if (n_files < MAX_BUFFERS) {
            files[n_files++] = argv[i];
        }
    }
    if (n_files != n_in + n_out)
        die("region %s takes %u input file(s) and %u output file(s), not %u file(s)", r->name,
            n_in, n_out, n_files);
    why = r->check(c);
    if (why) die("region %s cannot run at these constants: %s", r->name, why);

    open_instance(&d);
    steps = r->fused;
    n_steps = r->fused_count;
    if (unfused) {
        strcpy(path, "unfused");
        steps = r->unfused;
        n_steps = r->unfused_count;
    } else if ((why = product_refusal(&d, r->fused, r->fused_count, c)) != NULL) {
        if (r->fused_shared_count &&
            !product_refusal(&d, r->fused_shared, r->fused_shared_count, c)) {
            strcpy(path, "fused(shared exchange)");
            steps = r->fused_shared;
            n_steps = r->fused_shared_count;
        } else {
            snprintf(path, sizeof path, "fallback(%s)", why);
            steps = r->unfused;
            n_steps = r->unfused_count;
        }
    }
    if (n_steps > MAX_STEPS) die("region %s has too many kernels", r->name);
    why = product_refusal(&d, steps, n_steps, c);
    if (why) die("device '%s' cannot run region %s: %s", d.name, r->name, why);
    for (s = 0; s < n_steps; ++s) {
        needed |= steps[s].kernel->features;
        total_bindings += steps[s].kernel->binding_count;
    }
    open_device(&d, needed);

    /* buffers: inputs from their files; outputs and intermediates poisoned (every bit set:
       NaN in f32) so that a place no kernel wrote cannot pass for a result */
    for (i = 0; i < r->buffer_count; ++i) {
        const fusec_buffer *b = &r->buffers[i];
        uint64_t bytes = b->kind == FUSEC_BUFFER_PARAMS ? 4u * b->shape[0](c)
                                                        : fusec_buffer_bytes(b, c);
        make_buffer(&d, bytes, &buffers[i]);
        if (b->kind == FUSEC_BUFFER_INPUT) {
            read_file(files[i], buffers[i].mapped, bytes);
        } else if (b->kind == FUSEC_BUFFER_PARAMS) {
            uint32_t k, slot = 0, *words = buffers[i].mapped;
            for (k = 0; k < r->const_count; ++k)
                if (r->consts[k].runtime) words[slot++] = c[k].u; /* slots in spec_id order */
        } else {
            memset(buffers[i].mapped, 0xff, (size_t)buffers[i].size);
        }
    }
    /* arrival counters start at zero; every dispatch leaves them there */
    for (s = 0; s < n_steps; ++s)
        for (i = 0; i < steps[s].kernel->counter_count; ++i)
            memset(buffers[steps[s].kernel->counters[i]].mapped, 0,
                   (size_t)buffers[steps[s].kernel->counters[i]].size);

    pool_size.type = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    pool_size.descriptorCount = total_bindings;
    pool_info.maxSets = n_steps;
    pool_info.poolSizeCount = 1;
    pool_info.pPoolSizes = &pool_size;
    VK_CHECK(vkCreateDescriptorPool(d.device, &pool_info, NULL, &pool));
    for (s = 0; s < n_steps; ++s) make_pipeline(&d, steps[s].kernel, c, pool, buffers, &pipelines[s]);

    cmd_pool_info.queueFamilyIndex = d.queue_family;
    VK_CHECK(vkCreateCommandPool(d.device, &cmd_pool_info, NULL, &cmd_pool));
    cmd_info.commandPool = cmd_pool;
    cmd_info.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    cmd_info.commandBufferCount = 1;
    VK_CHECK(vkAllocateCommandBuffers(d.device, &cmd_info, &cmd));
    begin.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
    VK_CHECK(vkBeginCommandBuffer(cmd, &begin));

    /* the steps in order; consecutive kernels of one loop id run loop_count times */
    for (s = 0; s < n_steps;) {
        uint32_t end = s + 1, runs = 1, run, t;
        const fusec_kernel *k = steps[s].kernel;
        if (k->loop >= 0) {
            while (end < n_steps && steps[end].kernel->loop == k->loop) end++;
            runs = (uint32_t)k->loop_count(c);
        }
        for (run = 0; run < runs; ++run) {
            for (t = s; t < end; ++t) {
                const fusec_kernel *kt = steps[t].kernel;
                const pipeline *p = &pipelines[t];
                uint32_t z;
                if (kt->zero_count) { /* split-K outputs start at zero: a fill, then a barrier */
                    for (z = 0; z < kt->zero_count; ++z) {
                        const buffer *b = &buffers[kt->zero_outputs[z]];
                        vkCmdFillBuffer(cmd, b->handle, 0, b->size, 0);
                    }
                    barrier(cmd, VK_PIPELINE_STAGE_TRANSFER_BIT | VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                            VK_ACCESS_TRANSFER_WRITE_BIT | VK_ACCESS_SHADER_WRITE_BIT);
                    barriers++;
                }
                if (run == 0 ? steps[t].barrier_before : steps[t].barrier_before_repeat) {
                    barrier(cmd, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, VK_ACCESS_SHADER_WRITE_BIT);
                    barriers++;
                }
                vkCmdBindPipeline(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->pipeline);
                vkCmdBindDescriptorSets(cmd, VK_PIPELINE_BIND_POINT_COMPUTE, p->layout, 0, 1,
                                        &p->set, 0, NULL);
                vkCmdDispatch(cmd, kt->workgroups(c, p->subgroup_size), 1, 1);
                if (++dispatches > MAX_DISPATCHES) die("too many dispatches");
            }
        }
        s = end;
    }
    VK_CHECK(vkEndCommandBuffer(cmd));

    VK_CHECK(vkCreateFence(d.device, &fence_info, NULL, &fence));
    submit.commandBufferCount = 1;
    submit.pCommandBuffers = &cmd;
    VK_CHECK(vkQueueSubmit(d.queue, 1, &submit, fence));
    VK_CHECK(vkWaitForFences(d.device, 1, &fence, VK_TRUE, 600ull * 1000000000ull));

    for (i = 0, n_out = 0; i < r->buffer_count; ++i)
        if (r->buffers[i].kind == FUSEC_BUFFER_OUTPUT)
            write_file(files[n_in + n_out++], buffers[i].mapped, fusec_buffer_bytes(&r->buffers[i], c));

    printf("device: %s (subgroup %u)\n", d.name, d.subgroup_size);
    printf("%s: %s; %u dispatch(es), %u barrier(s); subgroup %u\n", r->name, path, dispatches,
           barriers, n_steps ? pipelines[0].subgroup_size : 0u);

    vkDestroyFence(d.device, fence, NULL);
    vkDestroyCommandPool(d.device, cmd_pool, NULL);
    for (s = 0; s < n_steps; ++s) {
        vkDestroyPipeline(d.device, pipelines[s].pipeline, NULL);
        vkDestroyPipelineLayout(d.device, pipelines[s].layout, NULL);
        vkDestroyDescriptorSetLayout(d.device, pipelines[s].set_layout, NULL);
        vkDestroyShaderModule(d.device, pipelines[s].module, NULL);
    }
    vkDestroyDescriptorPool(d.device, pool, NULL);
    for (i = 0; i < r->buffer_count; ++i) {
        vkUnmapMemory(d.device, buffers[i].memory);
        vkDestroyBuffer(d.device, buffers[i].handle, NULL);
        vkFreeMemory(d.device, buffers[i].memory, NULL);
    }
    vkDestroyDevice(d.device, NULL);
    vkDestroyInstance(d.instance, NULL);
    return 0;
}
