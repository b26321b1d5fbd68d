#!/usr/bin/env bash
# Installs the system packages fusec needs on Debian 12 (bookworm), idempotently.
#   - Vulkan loader, Mesa 25 lavapipe + RADV from bookworm-backports (FACTS.md: Debian 12's Mesa 22.3
#     lacks the features we use; the RADV null device needs Mesa 25)
#   - shaderc static libraries and headers (libshaderc-dev, glslang-dev, spirv-tools) and glslc
#   - a C compiler and the Vulkan headers (build-essential, libvulkan-dev): the C engine example
#     (examples/engine_c) and its test (tests/runtime/test_export.py) compile against them
set -euo pipefail

need=()
for pkg in libvulkan1 libvulkan-dev libshaderc-dev glslang-dev spirv-tools glslc build-essential; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
mesa_ok=0
if dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null | grep -q '^25\.'; then mesa_ok=1; fi

if [ ${#need[@]} -eq 0 ] && [ $mesa_ok -eq 1 ]; then
    echo "setup-system: system packages present"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    SUDO=sudo
else
    SUDO=
fi
export DEBIAN_FRONTEND=noninteractive
if ! grep -rqs "bookworm-backports" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "deb http://deb.debian.org/debian bookworm-backports main" | $SUDO tee /etc/apt/sources.list.d/fusec-backports.list >/dev/null
fi
$SUDO apt-get update -qq
if [ ${#need[@]} -gt 0 ]; then
    $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if [ $mesa_ok -eq 0 ]; then
    $SUDO apt-get install -y -qq --no-install-recommends -t bookworm-backports mesa-vulkan-drivers
fi
echo "setup-system: done"
