"""``python -m numerics.bench``: see :mod:`numerics.bench`."""
from numerics.bench import main

main()
