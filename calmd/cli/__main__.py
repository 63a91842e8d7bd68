"""`python -m calmd.cli ...`: the `calmd` command line."""

import sys

from calmd.cli import calmd_main

sys.exit(calmd_main())
