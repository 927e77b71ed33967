"""``python -m numerics.sweep``: see :mod:`numerics.sweep`."""
import sys

from numerics.sweep import main

sys.exit(main())
