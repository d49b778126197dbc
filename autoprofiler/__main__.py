import sys

from autoprofiler.cli import main

sys.exit(main())
