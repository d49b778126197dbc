"""``python -m autoprofiler.report TABLE_DIR --out runs/x ...``: write a report (see ``main``)."""

import sys

from autoprofiler.report import main

sys.exit(main())
