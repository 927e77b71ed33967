"""Files written whole or not at all: the sweep's point files and summaries, the bench's JSON.

The one writer is :func:`theory._validate.write_output` (every package may import theory):
a temporary ``.icl-tmp-*`` in the same directory (so ``os.replace`` is a rename within one
file system, atomic on POSIX and Windows), flushed and fsynced, then renamed over the
target (symbolic links followed; a character device such as /dev/null is written through,
never replaced); permission bits those of the replaced file, or the umask's default.  A
reader, or a process killed at any instant, sees the old content or the whole new one.
This module re-exports it and the output-path checks, and keeps the names the sweep uses.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

from theory._validate import (TEMP_PREFIX, check_output_dir, check_output_path,  # noqa: F401 (re-exported)
                              clean_stale_temporaries, write_output)

__all__ = ["TEMP_PREFIX", "check_output_dir", "check_output_path", "clean_stale_temporaries", "write_output",
           "write_text_atomic", "write_json_atomic"]


def write_text_atomic(path: Union[str, Path], text: str) -> None:
    """Replace ``path`` by ``text`` atomically (:func:`theory._validate.write_output`)."""
    write_output(path, text)


def write_json_atomic(path: Union[str, Path], obj: Any, allow_nan: bool = False) -> None:
    """``obj`` as indented JSON, atomically. ``allow_nan=False`` (strict JSON) raises on a
    non-finite float instead of writing the non-standard ``NaN``."""
    write_output(path, json.dumps(obj, indent=1, allow_nan=allow_nan) + "\n")
