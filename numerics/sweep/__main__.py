"""``python -m tools.sweep``: see :mod:`tools.sweep.cli`."""
import sys

from tools.sweep.cli import main

sys.exit(main())
