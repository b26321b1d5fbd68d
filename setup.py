"""Builds the in-process shaderc binding (a cffi API-mode extension) if the static libs exist.

If the extension cannot be built, the install still succeeds and fusec falls back to the `glslc`
executable with a one-line notice (codegen/shaderc.py).
"""

import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """A build_ext whose failure is a warning, not an install error."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:
            print(
                f"fusec: shaderc extension not built ({exc}); glslc will be used", file=sys.stderr
            )

    def build_extension(self, ext) -> None:  # type: ignore[no-untyped-def]
        try:
            super().build_extension(ext)
        except Exception as exc:
            print(
                f"fusec: shaderc extension not built ({exc}); glslc will be used", file=sys.stderr
            )


def _extensions() -> list:  # type: ignore[type-arg]
    try:
        sys.path.insert(0, "codegen")
        from shaderc_build import ffibuilder  # type: ignore[import-not-found]
    except Exception as exc:
        print(f"fusec: shaderc extension skipped ({exc})", file=sys.stderr)
        return []
    finally:
        sys.path.pop(0)
    return [ffibuilder.distutils_extension()]


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
