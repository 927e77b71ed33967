"""What the audit does that is not mathematics: reading its command lines, input files and
configuration, writing its outputs, and running its processes.

The ground floor of the project, below the rest of ``numerics``, ``claims`` and ``reports``: it
imports none of them and no torch (tests/test_theory_isolation.py checks it), and theory imports
nothing from it (theory is pure mathematics and checks only its own arguments; its command line
is ``reports.theory``).

- :mod:`numerics.io.command` -- the command lines' option parsers (one ``--tasks``), the one wrapper
  of every ``main(argv)``, the one check of a ``--device``, and the processes a command starts
  (workers that die with it, a process group with a timeout)
- :mod:`numerics.io.files`   -- input files, the output-path and link policy, the atomic writer,
  a full disk
- :mod:`numerics.io.handed`  -- a handed file read by its container first: memory budget, zip, npy,
  safetensors headers, pickles scanned unexecuted, strict JSON; the one JSON normaliser; TOML

A subpackage of ``numerics``, not a top-level ``cli``, ``io`` or ``utils``, so that it cannot
shadow the standard library's ``io`` or an installed distribution's top-level package (imports
are absolute: ``import io`` anywhere in ``numerics`` is the standard library's).
"""
