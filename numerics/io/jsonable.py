"""The one JSON normaliser of the project (claims.json, the sweep's point files, the bench)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any


def jsonable(obj: Any) -> Any:
    """Convert numpy/torch scalars and arrays, tuples, dataclasses and non-finite floats to plain
    JSON.

    Non-finite floats become the strings ``"nan"``, ``"inf"``, ``"-inf"`` so that the file is
    strict JSON; anything else that is not a number, a string, a sequence or a mapping becomes
    its ``str``."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):
        return jsonable(obj.tolist())
    if isinstance(obj, bool) or obj is None or isinstance(obj, (str, int)):
        return obj
    if isinstance(obj, float) or hasattr(obj, "__float__"):
        v = float(obj)
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v
    return str(obj)
