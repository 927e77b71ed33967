"""Alias kept for compatibility: the sweep runner moved to :mod:`tools.sweep` (issue 10).

``python -m numerics.sweep ...`` runs ``python -m tools.sweep ...``, and
``from numerics.sweep import run_grid, load_results, ...`` imports the same objects from
there. New code should use ``tools.sweep``.
"""
import sys

from tools.sweep import *  # noqa: F401,F403  (the public names, listed in tools.sweep.__all__)
from tools.sweep import main

if __name__ == "__main__":
    sys.exit(main())
