"""TOML reading: the standard library's ``tomllib`` (Python >= 3.11), else the ``tomli``
distribution it was taken from (declared for Python < 3.11 in pyproject.toml)."""
from __future__ import annotations

try:
    import tomllib as _toml
except ModuleNotFoundError:  # Python 3.10
    import tomli as _toml

TOMLDecodeError = _toml.TOMLDecodeError
"""The error of a text that is not valid TOML."""


def loads(text: str) -> dict:
    """The table of the TOML document ``text`` (raises :data:`TOMLDecodeError`)."""
    return _toml.loads(text)
