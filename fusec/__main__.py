"""`python -m fusec ARGS`, the same as the `fusec` command."""

import sys

from fusec.runtime.cli import main

if __name__ == "__main__":
    sys.exit(main())
