"""A tolerance built from named terms -- Z_SE standard errors, a step error, theory's stated
approximation error -- whose sentence (``why``) is generated from the same terms, so that the
argument a report prints cannot disagree with the number it compares at.
:func:`claims.core.common.compare` takes both from it."""
from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from operator import add

import numpy as np

from numerics.statistics import Z_SE


@dataclass(frozen=True)
class Tolerance:
    """The sum of ``terms``, ``(label, value)`` pairs (:func:`noise_term`, :func:`term`), added
    left to right as ``a + b + c`` is (floating-point addition is not associative: the order is
    the formula's), and :meth:`why`, the sentence listing the terms and their sum, then
    ``reason``: the argument for a term beyond its name.

    >>> t = Tolerance((noise_term(0.0021, "the held-out loss", 131072), term("SGD step error", 0.0012)))
    >>> t.value == Z_SE * 0.0021 + 0.0012
    True
    >>> t.why()
    '4 standard errors of the held-out loss (0.0021, 131072 prompts) 0.0084 + SGD step error 0.0012 = 0.0096'
    """

    terms: tuple
    reason: str = ""

    @property
    def value(self) -> float:
        return reduce(add, (value for _, value in self.terms))

    def why(self) -> str:
        total = f" = {_g(self.value)}" if len(self.terms) > 1 else ""     # one term: its own value
        return (" + ".join(f"{label} {_g(value)}" for label, value in self.terms) + total
                + (f"; {self.reason}" if self.reason else ""))


def noise_term(se: float, what: str, n=None) -> tuple:
    """The Monte-Carlo term: Z_SE x ``se`` (a number, or an array entrywise), the standard error of ``what``; ``n``, its sample (an
    int counts prompts; a string is printed as it is)."""
    sample = "" if n is None else f", {n} prompts" if isinstance(n, (int, np.integer)) else f", {n}"
    return f"{Z_SE:g} standard errors of {what} ({_g(se)}{sample})", Z_SE * se


def _g(x) -> str:
    """A number (3 digits), or per entry an array's (a tolerance entrywise)."""
    return f"{x:.3g}" if np.ndim(x) == 0 else "[" + ", ".join(f"{v:.3g}" for v in np.ravel(x)) + "]"


def term(label: str, value: float) -> tuple:
    """Any other named term: a step error, a resolution, theory's stated approximation error."""
    return label, value
