"""The stamped persistent product checked in a child process (tests/runtime/
test_persistent_stamps.py), so that lavapipe's LP_NATIVE_VECTOR_WIDTH applies to it alone.

`python tests/runtime/stamps_runs.py BUILD_DIR`: `check_stamped` on the tiny layer (the stamped
product against numpy, its stamps in order, the kernel inside the dispatch); prints one JSON
line (the subgroup size the product ran at, its stages); a failed check exits non-zero.
"""

from __future__ import annotations

import json
import sys

from fusec.runtime.device import Device
from fusec.runtime.dispatch import Build
from tests.runtime.test_persistent_stamps import check_stamped


def main(argv: list[str]) -> int:
    build = Build.load(argv[0])
    with Device() as dev:
        print(json.dumps(check_stamped(dev, build)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
