"""The one trajectory type of theory's gradient flows: the expansion flow
(theory.reduced_ode.integrate_expansion_flow) and the exact-loss flow (theory.exact.exact_flow).
A module of its own, numpy only, so that theory.exact need not import theory.reduced_ode
(sympy) to return one."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class FlowTrajectory:
    """A trajectory of a gradient flow on (omega, mu): t (T,), omega/mu (T, H, m), loss (T,).

    ``status``: "t_end" (reached t_end), "stationary" (velocity below the flow's
    ``stationary_tol``: a fixed point), "left_domain" (expansion flow only: some 2 omega^2
    reached 1 - margin, where the expansion stops being valid), "diverged" (loss or state
    non-finite / too large) or "failed" (solver error, ``message``); ``param`` the
    parametrisation whose metric the flow used."""

    t: np.ndarray
    omega: np.ndarray
    mu: np.ndarray
    loss: np.ndarray
    status: str
    message: str = ""
    param: str = "factored"

    @property
    def final_omega(self) -> np.ndarray:
        return self.omega[-1]

    @property
    def final_mu(self) -> np.ndarray:
        return self.mu[-1]

    def to_dict(self) -> dict:
        return {"t": self.t.tolist(), "omega": self.omega.tolist(), "mu": self.mu.tolist(),
                "loss": self.loss.tolist(), "status": self.status, "message": self.message,
                "param": self.param}
