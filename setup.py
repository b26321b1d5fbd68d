"""Builds the in-process shaderc binding (a cffi API-mode extension) if the static libs exist.

If the extension cannot be built, the install still succeeds and fusec falls back to the `glslc`
executable with a one-line notice (codegen/shaderc.py).
"""

import os
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
    # the generated C source goes to .setup-build/, not cffi's default build/: that is the
    # folder `fusec demo` and the README's `fusec build ... -o build/` write, and fusec never
    # replaces a folder it did not write (a newcomer's `make demo` stopped there)
    here = os.path.dirname(os.path.abspath(__file__))
    return [ffibuilder.distutils_extension(tmpdir=os.path.join(here, ".setup-build"))]


# setuptools' own build folder, too, is .setup-build/ (`pip wheel .` in a checkout would
# otherwise leave build/ behind, the folder `fusec demo` writes)
setup(
    ext_modules=_extensions(),
    cmdclass={"build_ext": OptionalBuildExt},
    options={"build": {"build_base": ".setup-build"}},
)
