"""fusec: declarative kernel-fusion regions for LLM decode, compiled to SPIR-V and verified.

The subpackages are `fusec.dsl` (the language: grammar, checker, numpy reference),
`fusec.codegen` (kernel IR, GLSL, SPIR-V, the register estimate, the build folder) and
`fusec.runtime` (Vulkan, verification, the CLI).  In a source checkout they are the top-level
folders `dsl/`, `codegen/` and `runtime/`, reached through the links in this folder; an
installed wheel holds them inside it (pyproject.toml, `package-dir`).
"""
