"""The audit report: runs the claim checks of ``claims`` and renders their results.

``python -m reports.build`` (or ``python -m reports``) writes ``claims.json``, a
self-contained ``index.html`` and the figures as PNG files, at a profile or at a
configuration of the researcher's choosing, or re-renders a finished report from its
claims.json (``--from-json``); ``python -m reports.compare A B`` sets two reports side by
side.  See ``reports.build`` for the command, ``reports.render`` for the drawing and
``reports.compare`` for the comparison.  Nothing in this package computes a result: every
number comes from a ``claims.base.ClaimResult``.
"""
