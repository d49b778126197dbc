"""``python -m autoprofiler.cli ...``: the same command line as ``autoprofiler ...``."""

import sys

from autoprofiler.cli import main

sys.exit(main())
