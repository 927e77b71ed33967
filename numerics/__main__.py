"""``python -m numerics ...`` is ``python -m numerics.train ...`` (see its --help)."""
import sys

from numerics.train import main

sys.exit(main())
