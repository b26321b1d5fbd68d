"""GLSL -> SPIR-V through shaderc: in process (the `fusec._shaderc` cffi extension built by the
package install), else the `glslc` executable with a one-line notice.

The only module that touches shaderc.  Errors that `#line` maps to a `.fuse` line become
Diagnostics; any other compiler error is an internal error (ours), raised with the GLSL saved.
"""

from __future__ import annotations

import functools
import importlib
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

from fusec.dsl.diagnostics import Diagnostic, DiagnosticError
from fusec.dsl.span import Source, Span

_SHADER_KIND_COMPUTE = 2  # FACTS.md: shaderc_glsl_compute_shader
_TARGET_ENV_VULKAN = 0
_ENV_VULKAN_1_2 = (1 << 22) | (2 << 12)
_SPIRV_1_5 = 0x010500
_OPT_PERFORMANCE = 2
_ERROR_LINE = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+): error: (?P<msg>.*)$", re.M)


class InternalCompilerError(RuntimeError):
    """shaderc rejected GLSL we generated without pointing at a `.fuse` line: our bug."""


@functools.cache
def _extension() -> Any | None:
    try:
        return importlib.import_module("fusec._shaderc")
    except ImportError:
        return None


@functools.cache
def backend() -> str:
    """'shaderc' (in process), 'glslc', or 'none'."""
    if _extension() is not None:
        return "shaderc"
    if shutil.which("glslc"):
        print(
            "fusec: in-process shaderc unavailable; using the glslc executable (slower)",
            file=sys.stderr,
        )
        return "glslc"
    return "none"


@functools.cache
def compiler_id() -> str:
    """The compiler that produces our SPIR-V, for cache keys: the backend, the compiled shaderc
    library (its file's size and modification time) or glslc's version line, and the options."""
    kind = backend()
    if kind == "shaderc":
        ext = _extension()
        path = Path(getattr(ext, "__file__", "") or "")
        try:
            st = path.stat()
            detail = f"{path.name}:{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            detail = path.name
    elif kind == "glslc":
        proc = subprocess.run(["glslc", "--version"], capture_output=True, text=True, check=False)
        detail = (proc.stdout.splitlines() or ["?"])[0]
    else:
        detail = ""
    options = f"env={_ENV_VULKAN_1_2:#x},spirv={_SPIRV_1_5:#x},opt={_OPT_PERFORMANCE}"
    return f"{kind}:{detail}:{options}"


_COMPILER: list[Any] = []  # the process's one shaderc compiler, made on first use
_COMPILER_LOCK = threading.Lock()


def _compiler(ffi: Any, lib: Any) -> Any:
    """One compiler for the whole process, never released.  Releasing the last compiler
    finalizes glslang, and the next one parses its built-in declarations again: about 50 ms per
    compile on the CI-class machine, five times the compile itself.  shaderc.h on
    shaderc_compile_into_spv: "May be safely called from multiple threads without explicit
    synchronization"."""
    with _COMPILER_LOCK:
        if not _COMPILER:
            compiler = lib.shaderc_compiler_initialize()
            if compiler == ffi.NULL:
                raise InternalCompilerError("shaderc could not initialize its compiler")
            _COMPILER.append(compiler)
        return _COMPILER[0]


def _compile_inprocess(text: str, name: str, debug: bool = False) -> tuple[bytes | None, str]:
    ext = _extension()
    assert ext is not None
    ffi, lib = ext.ffi, ext.lib
    compiler = _compiler(ffi, lib)
    options = lib.shaderc_compile_options_initialize()
    try:
        lib.shaderc_compile_options_set_target_env(options, _TARGET_ENV_VULKAN, _ENV_VULKAN_1_2)
        lib.shaderc_compile_options_set_target_spirv(options, _SPIRV_1_5)
        lib.shaderc_compile_options_set_optimization_level(options, _OPT_PERFORMANCE)
        if debug:
            lib.shaderc_compile_options_set_generate_debug_info(options)
        src = text.encode()
        result = lib.shaderc_compile_into_spv(
            compiler, src, len(src), _SHADER_KIND_COMPUTE, name.encode(), b"main", options
        )
        try:
            if lib.shaderc_result_get_compilation_status(result) != 0:
                return None, ffi.string(lib.shaderc_result_get_error_message(result)).decode()
            n = lib.shaderc_result_get_length(result)
            return bytes(ffi.buffer(lib.shaderc_result_get_bytes(result), n)), ""
        finally:
            lib.shaderc_result_release(result)
    finally:
        lib.shaderc_compile_options_release(options)


def _compile_glslc(text: str, name: str, debug: bool = False) -> tuple[bytes | None, str]:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / f"{Path(name).name}.comp"
        out = Path(tmp) / "out.spv"
        src.write_text(text)
        proc = subprocess.run(
            [
                "glslc",
                "--target-env=vulkan1.2",
                "-O",
                *(["-g"] if debug else []),
                "-fshader-stage=compute",
                str(src),
                "-o",
                str(out),
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            return None, proc.stderr
        return out.read_bytes(), ""


def compile_glsl(
    text: str, name: str, sources: dict[str, Source] | None = None, debug: bool = False
) -> bytes:
    """Compile one compute shader; returns SPIR-V bytes.  `debug`: with line information
    (OpLine, pointing at the `.fuse` lines of the GLSL's `#line` directives), for reports; a
    build never uses it."""
    kind = backend()
    if kind == "none":
        raise DiagnosticError(
            [
                Diagnostic(
                    None,
                    "no GLSL compiler: the shaderc extension is not built and glslc is not on PATH",
                    "run `make setup` (installs libshaderc-dev and glslc)",
                )
            ]
        )
    spv, log = (_compile_inprocess if kind == "shaderc" else _compile_glslc)(text, name, debug)
    if spv is not None:
        return spv
    diags = []
    for m in _ERROR_LINE.finditer(log):
        src = (sources or {}).get(m["file"])
        if src is None:
            continue
        line = int(m["line"])
        start = sum(len(x) + 1 for x in src.text.splitlines()[: line - 1])
        end = start + len(src.line_text(line))
        diags.append(Diagnostic(Span(src, start, end), f"GLSL compiler: {m['msg'].strip()}"))
    if diags:
        raise DiagnosticError(diags)
    saved = Path(tempfile.gettempdir()) / f"fusec-internal-{Path(name).name}.comp"
    saved.write_text(text)
    raise InternalCompilerError(
        f"shaderc rejected generated GLSL for {name} (saved to {saved}):\n{log}"
    )
