"""``python -m numerics.bench``: see :mod:`numerics.bench.cli`."""
from numerics.bench.cli import main

main()
