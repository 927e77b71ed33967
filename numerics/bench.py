"""Alias kept for compatibility: the benchmark moved to :mod:`tools.bench` (issue 10).

``python -m numerics.bench ...`` runs ``python -m tools.bench ...``; new code should use
``tools.bench``.
"""
from tools.bench import *  # noqa: F401,F403  (the public names, listed in tools.bench.__all__)
from tools.bench import main

if __name__ == "__main__":
    main()
