"""``python -m numerics.sweep``: see :mod:`numerics.sweep.cli`."""
import sys

from numerics.sweep.cli import main

sys.exit(main())
