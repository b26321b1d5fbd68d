#!/usr/bin/env bash
# Prepares what a run on the lent H200 machine needs (it has no internet and no Vulkan loader):
# Debian's loader and glvnd libraries as .deb files in .gl/, and CPython 3.12 wheels in .whl/.
# libGLX_nvidia (the NVIDIA Vulkan ICD) needs glvnd: without libglvnd0/libegl1 the loader reports
# "Could not get 'vkCreateInstance' via 'vk_icdGetInstanceProcAddr'" (seen 2026-11-29).
# On the device, start each command with:
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
#   export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
#   export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
#   S=$(mktemp -d); pip install -q --no-index --no-deps --target $S .whl/*.whl; export PYTHONPATH=$S:$PWD
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gl/' .git/info/exclude 2>/dev/null || echo /.gl/ >> .git/info/exclude
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
L=$(mktemp -d); mkdir -p .gl "$L/partial"
o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 "-oDir::State::Lists=$L")
apt-get "${o[@]}" update >/dev/null
(cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d .whl \
    vulkan==1.3.275.1 cffi pycparser lark attrs rich markdown-it-py mdurl pygments gguf pyyaml tqdm \
    jsonschema jsonschema-specifications referencing rpds-py typing-extensions
