"""The one trajectory type of theory's gradient flows and their one integrator: the expansion flow
(theory.reduced_ode.integrate_expansion_flow) and the exact-loss flow (theory.exact.exact_flow).
A module of its own, numpy and scipy only, so that theory.exact need not import theory.reduced_ode
(sympy) to integrate one."""
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


PARAMS = ("merged", "factored")


def factor_velocity(sign, a, v):
    """Velocity of a balanced factor a >= 0 of x = sign a^2 moving at dx/dt = v:
    da = sign v / (2a), and 0 where a = 0 (there the metric, and so v, vanishes like a^2)."""
    safe = np.where(a > 0, a, 1.0)
    return np.where(a > 0, sign * v / (2.0 * safe), 0.0)


def solve_flow(velocity, loss, omega0, mu0, param, t_end, t_eval, stops, rtol, atol, method) -> FlowTrajectory:
    """Integrate d(omega, mu)/dt = velocity(omega, mu) from (omega0, mu0) over [0, t_end] with
    scipy ``solve_ivp``, recording at ``t_eval`` (default 61 evenly spaced, as the numerics record).

    Coordinates: merged, (omega, mu) themselves; factored, the balanced factors
    omega = sign0 kappa^2, mu = sign0 nu^2 (as in the model: omega = kappa^2/s with K = Q = kappa,
    mu = nu^2 with O = V^T = nu).  The factored metric 2|omega| vanishes at 0, so the exact flow
    never changes the sign of an entry; in the factor coordinates a numerical step cannot make it
    do so either (d kappa = -sign0 kappa G/(s r) is linear in kappa).
    ``velocity`` returns None where the state is outside its domain (the state then stands
    still: a stop ends the run there).  ``stops``: (status, g(t, y, omega, mu, rhs)) terminal
    events, g crossing zero stops the flow with that status (the first in the list that fired);
    the state where it stopped is the last record.  ``loss(omega, mu)`` fills the records' losses."""
    from scipy.integrate import solve_ivp

    if param not in PARAMS:
        raise ValueError(f"param must be one of {PARAMS}, got {param!r}")
    if not np.isfinite(t_end) or t_end <= 0:
        raise ValueError(f"t_end must be positive and finite, got {t_end}")
    t_eval = np.linspace(0.0, t_end, 61) if t_eval is None else np.asarray(t_eval, dtype=float)
    if t_eval.ndim != 1 or np.any(np.diff(t_eval) <= 0) or t_eval[0] < 0 or t_eval[-1] > t_end:
        raise ValueError("t_eval must be increasing times within [0, t_end]")
    shape, n, merged = omega0.shape, omega0.size, param == "merged"
    sign_om, sign_mu = np.where(omega0 < 0, -1.0, 1.0), np.where(mu0 < 0, -1.0, 1.0)

    def point(y):
        a, c = y[:n].reshape(shape), y[n:].reshape(shape)
        return (a, c) if merged else (sign_om * a ** 2, sign_mu * c ** 2)

    def rhs(_t, y):
        v = velocity(*point(y))
        if v is None:
            return np.zeros_like(y)
        if merged:
            return np.concatenate([v[0].ravel(), v[1].ravel()])
        a, c = y[:n].reshape(shape), y[n:].reshape(shape)
        return np.concatenate([factor_velocity(sign_om, a, v[0]).ravel(), factor_velocity(sign_mu, c, v[1]).ravel()])

    def event(g):
        def crossed(t, y):
            return g(t, y, *point(y), rhs)
        crossed.terminal = True
        return crossed

    x0 = (omega0, mu0) if merged else (np.sqrt(np.abs(omega0)), np.sqrt(np.abs(mu0)))
    sol = solve_ivp(rhs, (0.0, float(t_end)), np.concatenate([x.ravel() for x in x0]), method=method,
                    t_eval=t_eval, events=[event(g) for _, g in stops], rtol=rtol, atol=atol)
    status = {-1: "failed", 0: "t_end"}.get(sol.status)
    ts, ys = list(sol.t), [sol.y[:, j] for j in range(sol.y.shape[1])]
    if sol.status == 1:
        status = next(name for (name, _), ev_t in zip(stops, sol.t_events) if len(ev_t))
        for ev_t, ev_y in zip(sol.t_events, sol.y_events):
            if len(ev_t) and (not ts or ev_t[0] > ts[-1]):
                ts.append(float(ev_t[0]))
                ys.append(ev_y[0])
    points = [point(y) for y in ys]
    om = np.stack([p[0] for p in points]) if points else np.empty((0,) + shape)
    mu = np.stack([p[1] for p in points]) if points else np.empty((0,) + shape)
    return FlowTrajectory(t=np.asarray(ts), omega=om, mu=mu, loss=np.array([loss(o, u) for o, u in zip(om, mu)]),
                          status=status, message=sol.message, param=param)
