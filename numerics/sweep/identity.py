"""Point identity: the content hash that names a point, and the code version inside it
(defined in :mod:`numerics.stored`, beside the one reader of a stored point; re-exported here).

A point is stored as ``DIR/points/<point_id>.json``; a sweep run again skips the points whose
file exists, so the id must change exactly when the numbers would: when the configuration
changes, when the training code changes (:func:`code_version`) or when the point function is
not the default training run.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Union

# the identity of a stored point lives with the reader that checks it (numerics.stored: the
# library's sweep store reads points too, and never imports numerics.sweep); re-exported here
from numerics.stored import (CODE_ENTRY_MODULES, DEFAULT_POINT_FN, DEFAULT_POINT_FN_NAMES,  # noqa: F401
                             ID_HEX_DIGITS, PROJECT_PACKAGES, REPO_ROOT, canonical_json, code_sources,
                             code_version, package_version, point_id)

PointFn = Callable[[dict], Any]


def fn_name(fn: Union[str, PointFn]) -> str:
    """``module:qualname`` of a point function; a ``functools.partial`` adds its bound
    arguments (they change what the function computes, hence the point ids)."""
    if isinstance(fn, str):
        return fn
    if isinstance(fn, functools.partial):
        return f"{fn_name(fn.func)}(*{fn.args!r}, **{fn.keywords!r})"
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{getattr(fn, '__module__', type(fn).__module__)}:{qualname}"
