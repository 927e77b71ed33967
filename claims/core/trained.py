"""What the claims on trained full models share (claims 5, 6 and boundary-left-allocation):
their domain and trained family, where a trained run stands against theory's account
(:func:`run_status`: its status and the side theory puts it on), the one comparison of its
held-out loss with theory's exact loss, the Monte-Carlo minima of the exact reduced loss with
the comparison of a large-L measurement against theory's L -> inf limit, and the figure of
the trained points against theory's line.
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field

import numpy as np

from claims.core.base import Figure
from claims.core.common import (Z_SE, Comparison, Tolerance, compare, config_label, lines_figure, noise_term,
                                off_by, term)
from numerics.engine import need
from numerics.config import ProblemConfig
from numerics.experiments.converged import TrainingSchedule, converged_for
from numerics.evaluate import ALLOCATED_SHARE


@dataclass(frozen=True)
class TrainedProfile:
    """The profile of claims 5 and 6: the trained family, the bridge and the large-L rows."""
    cases: tuple = (((2, 2), 0.0),)        # (tasks, sigma) of the trained models and the limit rows
    train_Ls: tuple = (32, 64)             # context lengths of the trained full models (>= 2 for claim 5's decay)
    schedule: TrainingSchedule = field(default_factory=TrainingSchedule)   # explore + polish, held-out size
    bridge_elements: int = 2 ** 22         # exact reduced minima at the largest trained L: eval prompts x L
    limit_L: int = 4096                    # the L of the large-L row
    limit_elements: int = 2 ** 24          # its evaluation prompts x L
    fit_elements: int = 2 ** 17            # fit sample of the exact reduced minima (prompts x L)
    limit_fit_prompts: int = 512           # the limit row's fit sample, in prompts (see limit_fit_elements)
    problem: tuple = ()                    # a researcher's ProblemConfig fields (sorted items), if any

    @property
    def limit_fit_elements(self) -> int:
        """Fit sample of the limit row's minima (prompts x limit_L).  A minimum fitted on n prompts
        and measured on fresh ones lies above the true minimum by about p CV^2 / 2n of the loss
        (p fitted parameters, CV the per-prompt loss's coefficient of variation): a bias the
        evaluation's standard error does not see.  fit_elements / limit_L gave the floor of 128
        prompts at L = 4096, where claim 6's gain at (3,3,3), sigma 0.5 came out 2.087 +- 0.011
        against the exact 2.204 (seeds 1-2: 2.165, 2.188); 512 prompts gave 2.194-2.196 on three
        seeds."""
        return max(self.fit_elements, self.limit_fit_prompts * self.limit_L)


SATURATED_OMEGA = 1.0
"""A trained run whose largest |omega| readout exceeds SATURATED_OMEGA sits in the softmax's
saturation regime (2 omega^2 = 2, twice the edge 2 omega^2 = 1 beyond which theory's L -> inf
loss diverges), not at a point of theory's account: the allocated and one-head optima lie
inside the edge (omega* <= 0.71 for r <= 4 at L >= 32).  Seen: one head, tasks (3, 4, 4),
L = 128, sigma 0 (thorough draw) ended at omega ~ 3.2, mu ~ 0.58, loss 6.26 against the
one-head optimum 2.30 (omega* 0.30), still descending.  Decides which theory applies (a
boundary finding), never the agreement itself."""


TAIL_FACTOR = 2.0
"""The part of L * loss (or of the gain) still to come beyond L is bounded by TAIL_FACTOR times
theory.exact's change of it over [L, 4L]: for a correction c L^-p the tail is the change /
(1 - 4^-p), <= 2 for p >= 1/2 (the slowest correction of numerics.statistics.CORRECTION_POWERS;
measured on theory.exact: the change of L * loss over [4096, 16384] is 0.38x that over
[1024, 4096] at r = 2, p ~ 0.7)."""


def domain(cfg: ProblemConfig, gain: bool = False) -> dict:
    """Where theory's account applies to a trained model, from the configuration alone (before
    any run): the factored parametrisation (the allocated point is a fixed point of the factored
    metric 2|mu|, which vanishes at mu = 0; the merged flow leaves it for a superposition,
    docs/model.md), the decomposable balanced start theory's flow starts from, and

    - one model (claim 5, boundary-left-allocation): H = m (with H < m some head serves several
      tasks; with H > m the surplus heads idle only at t -> inf, a race at finite t);
    - the gain (claim 6, ``gain``: m heads against one head): m >= 2 (with one task the gain
      is 1 = H, nothing can be told apart)."""
    reasons = ["m = 1: one task, the gain is 1 = H, nothing to tell apart"] if gain and cfg.m < 2 else []
    if cfg.param != "factored":
        reasons.append(f"param={cfg.param}: the allocated point is a fixed point of the factored metric only"
                       + ("" if gain else " (the merged flow ends in a superposition, docs/model.md)"))
    if cfg.init != "decomposable":
        reasons.append(f"init={cfg.init}: theory's flow starts decomposable and balanced")
    if not gain and cfg.heads < cfg.m:
        reasons.append(f"H={cfg.heads} < m={cfg.m}: some head serves several tasks, not the allocated point")
    if not gain and cfg.heads > cfg.m:
        reasons.append(f"H={cfg.heads} > m={cfg.m}: surplus heads idle only at t -> inf (a race at finite t)")
    conditions = ("m >= 2, factored parametrisation, decomposable balanced start; both trained runs converged and "
                  "the m-head run ended allocated" if gain else "factored parametrisation, decomposable balanced "
                  "start, H = m; the run converged (held-out loss no longer falling) and ended allocated")
    return {"inside": not reasons, "reasons": reasons, "conditions": conditions}


def configurations(p, device: str = "cpu") -> list[tuple[ProblemConfig, tuple]]:
    """The trained family of claims 5 and 6 at the profile ``p``: each profile case (tasks, sigma) with H = m heads
    at the profile's train_Ls, or the researcher's problem at L and 2L."""
    if p.problem:
        base = ProblemConfig.from_dict({**dict(p.problem), "device": device})
        return [(base, (base.L, 2 * base.L))]
    return [(ProblemConfig(tasks=tuple(t), heads=len(t), L=p.train_Ls[0], sigma=s, device=device), p.train_Ls)
            for t, s in p.cases]


def trained_need(cfg: ProblemConfig, schedule: TrainingSchedule):
    """The converged run of ``cfg`` by ``schedule``.  Its prompt stream is named by the problem
    (tasks, sigma, L) and not by the head count: claim 6's m-head and one-head runs of a problem
    see the same prompts (common random numbers, for the paired gain), and every claim that
    trains the problem at one schedule asks for the same run."""
    return need("converged", cfg=cfg, schedule=schedule,
                stream=("trained run", tuple(cfg.tasks), float(cfg.sigma), int(cfg.L)))


def minima_need(tasks, sigma: float, L: int, elements: int, fit_elements: int, device: str, stream: tuple):
    """(allocated, one head): the Monte-Carlo minima of the exact reduced loss at L on one
    evaluation sample (``numerics.exact_reduced.reduced_minima``)."""
    return need("reduced_minima", tasks=tuple(tasks), sigma=float(sigma), L=int(L), elements=int(elements),
                fit_elements=int(fit_elements), device=str(device), stream=stream)


def bridge_need(p, tasks, sigma, L, device):
    """The exact reduced minima at the largest trained L (the bridge of claims 5 and 6)."""
    return minima_need(tasks, sigma, L, p.bridge_elements, p.fit_elements, device, ("bridge", tasks, sigma))


def limit_need(p, tasks, sigma, device):
    """The exact reduced minima at limit_L (the limit row of claims 5 and 6)."""
    return minima_need(tasks, sigma, p.limit_L, p.limit_elements, p.limit_fit_elements, device,
                       ("limit", tasks, sigma))



def run_tolerance(run) -> Tolerance:
    """The tolerance of the comparison a trained run's held-out loss feeds first (claim 5's
    :func:`check_trained_loss`, less theory's quadrature bound of ~1e-12): Z_SE standard errors
    of the held-out loss + the SGD step's excess left after polishing, from the run's own
    numbers before any comparison."""
    return Tolerance((noise_term(run["se"], "the held-out loss", f"{run['n']} fresh prompts"),
                      term("the SGD step's excess left after polishing (from the run's own explore/polish losses)",
                           run["step_error"])))


def run_status(cfg, run, inside: dict, outside_sides: bool = False, tolerance: float | None = None) -> tuple[str, int]:
    """(status, sign) of a converged run (``numerics.experiments.converged``): "inside", or the
    boundary it is at with the side theory puts it on (+1: not below the prediction, -1: not
    above it, 0: no side).  Decided from the run's own readout, in this order: outside the
    claim's domain (``inside``, from the configuration alone); saturated (largest |omega| above
    :data:`SATURATED_OMEGA`); left the allocated set for a superposition (``numerics.evaluate``:
    an opposite-sign off-task mu above ALLOCATED_SHARE): -1, a superposition lowers the loss;
    not converged (``numerics.experiments.converged.converged_for`` at ``tolerance``, default
    :func:`run_tolerance`: the loss it could still lose is more than tolerance / Z_SE, or heads
    not yet pruned): +1; else inside, compared two-sidedly.

    ``outside_sides``: outside the domain, a factored decomposable run still has a side (claim
    5's family argument): H < m -> the best model with fewer heads is above the fixed point, and
    an unconverged run further above (+1); H > m -> the family contains the allocated point, so
    a converged run is not above it (-1), while an unconverged one has no side (its surplus
    heads race)."""
    if tolerance is not None:
        tol = float(tolerance)
    elif run.get("descent_left") is None:
        tol = None          # a run handed in without a descent fit is read by its own "converged"
    else:
        tol = run_tolerance(run).value
    converged = converged_for(run, math.inf if tol is None else tol)
    if not inside["inside"]:
        status, sign = "outside the domain: " + "; ".join(inside["reasons"]), 0
        if outside_sides and cfg.param == "factored" and cfg.init == "decomposable":
            sign = +1 if cfg.heads < cfg.m else (-1 if converged else 0)
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
    if not converged:
        left = run.get("descent_left")
        if left is None or tol is None:
            return "not converged (held-out loss still falling)", +1
        return ("not converged (held-out loss still falling: it could still lose "
                f"{left:.3g} against tolerance / {Z_SE:g} = {tol / Z_SE:.3g})"), +1
    if cfg.heads > 1 and not alloc["allocated"]:
        return ("not converged (heads not yet pruned: off-task share "
                f"{alloc['same_sign_share']:.2f})"), +1
    return "inside", 0


def check_trained_loss(cfg, run, predicted: dict, name: str, status: tuple,
                       target: str = "the prediction") -> Comparison:
    """A trained run's converged (held-out) loss against theory's exact finite-L loss
    ``predicted`` ({"loss", "error_estimate"}).  Tolerance (fixed before comparing): Z_SE
    standard errors of the held-out loss + the SGD step's excess left after polishing
    (``run["step_error"]``, from the run's own losses) + the quadrature error bound.  Inside
    the domain: |measured - predicted| <= tolerance, perturbations prediction x1.1 and /1.1.
    Outside: the one-sided boundary check on theory's side (``status``), no perturbation; with
    no side, the check that the model learned something (below the zero model's loss sum r_i,
    at Z_SE standard errors)."""
    meas, pred = run["loss"], predicted["loss"]
    terms = run_tolerance(run).terms + (term("theory's quadrature error bound", predicted["error_estimate"]),)
    st, sign = status
    details = {"run": run.to_dict() if hasattr(run, "to_dict") else run, "prediction": predicted, "status": st}
    if st == "inside":
        return compare(name, meas, pred, Tolerance(terms), wrong=off_by(1.1, pred), details=details,
                       config=config_label(cfg))
    if sign == 0:
        bound, side = "below the zero model's loss sum r_i", "not above"
        pred, terms = float(sum(cfg.tasks)), terms[:1]
    else:
        side = "not below" if sign > 0 else "not above"
        bound = f"{side} {target}"
    details["boundary_check"] = bound
    return compare(f"{name} [boundary: {st.split(':')[0].split(' (')[0]}]", meas, pred,
                   Tolerance(terms, f"boundary finding ({st}); check: {bound}"), side=side, details=details,
                   config=config_label(cfg))


def check_trained(cfg, run, predicted: dict, label: str | None, status: tuple,
                  target: str = "the prediction") -> Comparison:
    """:func:`check_trained_loss` under the trained rows' name (``label``: which model of the
    pair, claim 6)."""
    model = "trained full model" + (f" ({label})" if label else "")
    name = f"converged loss of {model}, tasks={list(cfg.tasks)}, L={cfg.L}, sigma={cfg.sigma:g}"
    return check_trained_loss(cfg, run, predicted, name, status, target)


def check_large_L(name: str, measured: float, se: float, se_what: str, limit: float, change: float,
                  quantity: str, wrong, details: dict, quadrature: float = 0.0) -> Comparison:
    """A Monte-Carlo measurement at a large L (standard error ``se``) against theory's L -> inf
    ``limit``.  Tolerance: Z_SE standard errors (of ``se_what``) + theory's approximation error at L, the part of
    the ``quantity`` still to come beyond L, TAIL_FACTOR x |``change``| (theory.exact's change of
    it over [L, 4L]: exact theory, never from the limit, so a wrong limit cannot widen its own
    tolerance) + ``quadrature`` (theory.exact's quadrature bound, where it enters)."""
    tail = TAIL_FACTOR * abs(change)
    tol = Tolerance((noise_term(se, se_what),
                     term(f"theory's approximation error at L: the part of {quantity} still to come beyond L, "
                          f"{TAIL_FACTOR:g} x theory.exact's change over [L, 4L]", tail))
                    + ((term("theory's quadrature bound", quadrature),) if quadrature else ()))
    return compare(name, measured, limit, tol, wrong=wrong, details={**details, "tail": tail})


def case_figure(name: str, title: str, points: dict, measured: str, theory: str, **figure) -> Figure:
    """Per case of ``points`` ({(tasks, sigma): [(x, measured, theory), ...]}) the measured points
    and theory's line; ``figure``: the other Figure fields."""
    curves = []
    for (tasks, sigma), rows in points.items():
        x, case = [r[0] for r in rows], f"tasks={list(tasks)} sigma={sigma:g}"
        curves += [(f"{measured}, {case}", x, [r[1] for r in rows], "points"),
                   (f"{theory}, {case}", x, [r[2] for r in rows], "line")]
    return lines_figure(name, title, curves, **figure)
