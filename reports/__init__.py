"""The audit report: runs the claim checks of ``claims`` and renders their results.

``python -m reports.build`` (or ``python -m reports``) writes ``claims.json``, a
self-contained ``index.html`` and the figures as PNG files; see ``reports.build`` for the
command and ``reports.render`` for the drawing.  Nothing in this package computes a result:
every number comes from a ``claims.base.ClaimResult``.
"""
