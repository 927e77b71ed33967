"""Files written whole or not at all: the sweep's point files and summaries, the bench's JSON.

A temporary file in the same directory (so ``os.replace`` is a rename within one file
system, atomic on POSIX and Windows), flushed and fsynced, then renamed over ``path``: a
reader, or a process killed at any instant, sees the old content or the whole new one.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Union


def write_text_atomic(path: Union[str, Path], text: str) -> None:
    """Replace ``path`` by ``text`` atomically (the temporary is ``.NAME.PID.HEX.tmp``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_json_atomic(path: Union[str, Path], obj: Any, allow_nan: bool = False) -> None:
    """``obj`` as indented JSON, atomically. ``allow_nan=False`` (strict JSON) raises on a
    non-finite float instead of writing the non-standard ``NaN``."""
    write_text_atomic(path, json.dumps(obj, indent=1, allow_nan=allow_nan) + "\n")
