"""``python -m tools.bench``: see :mod:`tools.bench.cli`."""
from tools.bench.cli import main

main()
