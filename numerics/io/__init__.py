"""What the audit does that is not mathematics: reading its command lines, input files and
configuration, writing its outputs, and running its processes.

The ground floor of the project, below ``theory``, ``numerics``, ``claims``, ``reports`` and
``tools``: it imports none of them (tests/test_theory_isolation.py checks it), and ``theory``
imports nothing from it (theory is pure mathematics and checks only its own arguments).

- :mod:`audit_io.options`   -- the command lines' number and option parsers (one ``--tasks``)
- :mod:`audit_io.files`     -- input files, the output-path and link policy, the atomic writer,
  a full disk
- :mod:`audit_io.handed`    -- a handed file read by its container first: memory budget, zip, npy,
  safetensors headers, pickles scanned unexecuted, strict JSON
- :mod:`audit_io.processes` -- workers that die with their command, a process group with a timeout
- :mod:`audit_io.command`   -- the one wrapper of every ``main(argv)``
- :mod:`audit_io.jsonable`  -- the one JSON normaliser
- :mod:`audit_io.toml`      -- TOML reading (``tomllib``, or ``tomli`` before Python 3.11)
- :mod:`audit_io.device`    -- the one check of a ``--device`` option

Named ``audit_io`` (not ``cli``, ``io`` or ``utils``) so that it cannot shadow the standard
library's ``io`` or an installed distribution's top-level package.
"""
