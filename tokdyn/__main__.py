"""``python -m tokdyn``: the ``tokdyn`` command, for environments without its script on PATH."""

import sys

from tokdyn.cli import main

sys.exit(main())
