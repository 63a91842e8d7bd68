"""`python -m calmd ...`: the `calmd` command line (the shell hooks start their helper this way)."""

import sys

from calmd.cli import calmd_main

sys.exit(calmd_main())
