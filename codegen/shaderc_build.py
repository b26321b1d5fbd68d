"""cffi API-mode build script for `fusec._shaderc`, the in-process shaderc binding.

Links the static libraries from Debian's libshaderc-dev, glslang-dev and spirv-tools; the shared
libshaderc1 (2023.2) cannot be dlopen'ed (FACTS.md: undefined spvtools::utils::Timer vtable).
"""

from cffi import FFI

ffibuilder = FFI()
ffibuilder.cdef(
    """
    typedef struct shaderc_compiler* shaderc_compiler_t;
    typedef struct shaderc_compile_options* shaderc_compile_options_t;
    typedef struct shaderc_compilation_result* shaderc_compilation_result_t;
    shaderc_compiler_t shaderc_compiler_initialize(void);
    void shaderc_compiler_release(shaderc_compiler_t);
    shaderc_compile_options_t shaderc_compile_options_initialize(void);
    void shaderc_compile_options_release(shaderc_compile_options_t options);
    void shaderc_compile_options_set_optimization_level(shaderc_compile_options_t, int level);
    void shaderc_compile_options_set_target_env(shaderc_compile_options_t options, int target,
                                                uint32_t version);
    void shaderc_compile_options_set_target_spirv(shaderc_compile_options_t options, int version);
    void shaderc_compile_options_set_generate_debug_info(shaderc_compile_options_t options);
    shaderc_compilation_result_t shaderc_compile_into_spv(
        const shaderc_compiler_t compiler, const char* source_text, size_t source_text_size,
        int shader_kind, const char* input_file_name, const char* entry_point_name,
        const shaderc_compile_options_t additional_options);
    void shaderc_result_release(shaderc_compilation_result_t result);
    size_t shaderc_result_get_length(const shaderc_compilation_result_t result);
    const char* shaderc_result_get_bytes(const shaderc_compilation_result_t result);
    int shaderc_result_get_compilation_status(const shaderc_compilation_result_t);
    const char* shaderc_result_get_error_message(const shaderc_compilation_result_t result);
    """
)
ffibuilder.set_source(
    "fusec._shaderc",
    "#include <shaderc/shaderc.h>",
    extra_link_args=[
        "-Wl,--start-group",
        "-l:libshaderc_combined.a",
        "-lglslang",
        "-lMachineIndependent",
        "-lGenericCodeGen",
        "-lOSDependent",
        "-lOGLCompiler",
        "-lHLSL",
        "-lSPIRV",
        "-lSPIRV-Tools-opt",
        "-lSPIRV-Tools",
        "-lglslang-default-resource-limits",
        "-Wl,--end-group",
        "-lstdc++",
        "-lpthread",
    ],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
