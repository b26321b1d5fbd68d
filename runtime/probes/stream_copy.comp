// Bandwidth probe for `fusec bench`: copies `n` 16-byte words, grid-stride, so the weight-
// streaming floor is measured with the same kind of work our kernels do (a compute shader's
// loads and stores), not with the copy engine behind vkCmdCopyBuffer.
// Rebuild after editing: glslc --target-env=vulkan1.2 -O stream_copy.comp -o stream_copy.spv
// (tests/runtime/test_probes.py checks that the committed SPIR-V matches this source).
#version 450
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint n = 1u;
layout(set = 0, binding = 0, std430) readonly buffer A { uvec4 a[]; };
layout(set = 0, binding = 1, std430) writeonly buffer B { uvec4 b[]; };
void main() {
    for (uint i = gl_GlobalInvocationID.x; i < n; i += gl_NumWorkGroups.x * 256u) {
        b[i] = a[i];
    }
}
