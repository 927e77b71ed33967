"""The audit report: runs the claim checks of ``claims`` and renders their results.

``python -m reports.build`` (or ``python -m reports``) writes ``claims.json`` (findings first,
then one entry per claim), a self-contained ``index.html`` whose first screen is the findings,
and the figures as PNG files, at a profile or at a configuration of the researcher's choosing,
or re-renders a finished report from its claims.json (``--from-json``); ``python -m
reports.compare A B`` sets two reports side by side; ``python -m reports.findings`` writes
README's findings block; ``python -m reports.theory`` prints theory's predictions at one
configuration (theory itself does no I/O).  Modules: ``build`` (the command: what the claims
say before any runs -- configuration, cost, sweep -- running them, progress, provenance, and its
--out directory), ``schema`` (claims.json's schema, derived from
``claims.core``), ``render`` (figures, page).  Nothing in this package computes a result:
every number comes from a ``claims.core.ClaimResult``, or in ``reports.theory`` from theory.
"""
