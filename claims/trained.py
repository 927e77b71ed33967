"""What the claims on trained full models share (claims 5 and 6): where a trained run stands
against theory's account (its status and the side theory puts it on) and the one comparison
of its held-out loss with theory's exact loss.

Status of a converged run (``numerics.experiments.converged``), decided from the run's own
readout, in this order:

- outside the claim's domain (from the configuration alone);
- saturated: largest |omega| above :data:`SATURATED_OMEGA`;
- left the allocated set for a superposition (``numerics.readout``: an opposite-sign off-task
  mu above ALLOCATED_SHARE): theory's side "not above" (a superposition lowers the loss);
- not converged (held-out loss still falling, or heads not yet pruned): "not below";
- inside: compared two-sidedly.
"""
from __future__ import annotations

import numpy as np

from claims.common import Z_SE, Comparison, config_label, perturbation
from numerics.readout import ALLOCATED_SHARE

SATURATED_OMEGA = 1.0
"""A trained run whose largest |omega| readout exceeds SATURATED_OMEGA sits in the softmax's
saturation regime (2 omega^2 = 2, twice the edge 2 omega^2 = 1 beyond which theory's L -> inf
loss diverges), not at a point of theory's account: the allocated and one-head optima lie
inside the edge (omega* <= 0.71 for r <= 4 at L >= 32).  Seen: one head, tasks (3, 4, 4),
L = 128, sigma 0 (thorough draw) ended at omega ~ 3.2, mu ~ 0.58, loss 6.26 against the
one-head optimum 2.30 (omega* 0.30), still descending.  Decides which theory applies (a
boundary finding), never the agreement itself."""


def run_status(cfg, run, inside: dict, outside_sides: bool = False) -> tuple[str, int]:
    """(status, sign) of a trained run: "inside", or the boundary it is at with the side theory
    puts it on (+1: not below the prediction, -1: not above it, 0: no side).

    ``outside_sides``: outside the domain, a factored decomposable run still has a side (claim
    5's family argument): H < m -> the best model with fewer heads is above the fixed point, and
    an unconverged run further above (+1); H > m -> the family contains the allocated point, so
    a converged run is not above it (-1), while an unconverged one has no side (its surplus
    heads race)."""
    if not inside["inside"]:
        status, sign = "outside the domain: " + "; ".join(inside["reasons"]), 0
        if outside_sides and cfg.param == "factored" and cfg.init == "decomposable":
            sign = +1 if cfg.heads < cfg.m else (-1 if run["converged"] else 0)
            if sign == 0:
                status += "; not converged (held-out loss still falling): no side of the fixed point"
        return status, sign
    om = float(np.max(np.abs(run["omega"]))) if run.get("omega") is not None else 0.0
    if om > SATURATED_OMEGA:
        return (f"saturated (largest |omega| {om:.2f} > {SATURATED_OMEGA:g}: the softmax's saturation regime, "
                "not a point of theory's account)"), (+1 if cfg.heads < cfg.m else 0)
    alloc = run["allocation"]
    if cfg.heads > 1 and alloc["opposite_sign_share"] > ALLOCATED_SHARE:
        return (f"left the allocated set (an off-task mu of opposite sign, share {alloc['opposite_sign_share']:.2f} "
                f"> {ALLOCATED_SHARE:g}: a superposition)"), -1
    if not run["converged"] or (cfg.heads > 1 and not alloc["allocated"]):
        return ("not converged (held-out loss still falling, or heads not yet pruned: off-task share "
                f"{alloc['same_sign_share']:.2f})"), +1
    return "inside", 0


def check_trained_loss(cfg, run, predicted: dict, name: str, status: tuple, target: str = "the prediction") -> Comparison:
    """A trained run's converged (held-out) loss against theory's exact finite-L loss
    ``predicted`` ({"loss", "error_estimate"}).  Tolerance (fixed before comparing): Z_SE
    standard errors of the held-out loss + the SGD step's excess left after polishing
    (``run["step_error"]``, from the run's own losses) + the quadrature error bound.  Inside
    the domain: |measured - predicted| <= tolerance, perturbations prediction x1.1 and /1.1.
    Outside: the one-sided boundary check on theory's side (``status``), no perturbation; with
    no side, the check that the model learned something (below the zero model's loss sum r_i,
    at Z_SE standard errors)."""
    meas, pred = run["loss"], predicted["loss"]
    tol = Z_SE * run["se"] + run["step_error"] + predicted["error_estimate"]
    why = (f"{Z_SE:g} standard errors of the held-out loss ({run['se']:.3g}, {run['n']} fresh prompts) plus the SGD "
           f"step's excess left after polishing ({run['step_error']:.3g}, from the run's own explore/polish losses) "
           f"plus theory's quadrature error bound")
    st, sign = status
    details = {"run": run.to_dict() if hasattr(run, "to_dict") else run, "prediction": predicted, "status": st}
    label = config_label(cfg)
    if st == "inside":
        return Comparison(name=name, measured=meas, predicted=pred, error=abs(meas - pred), tolerance=tol, why=why,
                          perturbations=[perturbation("prediction x1.1", abs(meas - 1.1 * pred), tol,
                                                      predicted=1.1 * pred),
                                         perturbation("prediction /1.1", abs(meas - pred / 1.1), tol,
                                                      predicted=pred / 1.1)],
                          details=details, config=label)
    if sign > 0:
        err, bound, side = max(0.0, pred - meas), f"not below {target}", "not below"
    elif sign < 0:
        err, bound, side = max(0.0, meas - pred), f"not above {target}", "not above"
    else:
        base = float(sum(cfg.tasks))
        err, bound, tol, side = max(0.0, meas - base), "below the zero model's loss sum r_i", Z_SE * run["se"], "not above"
        pred = base
    details["boundary_check"] = bound
    return Comparison(name=f"{name} [boundary: {st.split(':')[0].split(' (')[0]}]", measured=meas, predicted=pred,
                      error=err, tolerance=tol, why=f"boundary finding ({st}); check: {bound}; " + why,
                      details=details, side=side, config=label)
