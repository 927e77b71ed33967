"""The audit of models trained by anyone: what the paper's theory says about handed weights.

``python -m reports.audit CHECKPOINT ...`` (docs/audit.md has the account in full).  Nothing is
trained: numerics reads and measures each checkpoint (``numerics.external``), theory gives its
reference points at the researcher's configuration (``numerics.reference_points``), and this module
places each model among them and compares where the paper's account applies, through the one runner
(``claims.core.run_spec``; not in ``claims.REGISTRY``): ``model-K`` per judged checkpoint -- inside
the allocated account (on D, allocated, H >= m, not saturated, converged: :func:`domain`,
``claims.core.run_status``) a claim, its loss and served (omega, mu) against the exact allocated
fixed point; outside a boundary, checked on the side theory puts it; the *ladder* (its loss over
each reference point) reported, never judged -- and ``trajectory`` for a run: its phase times and
final winners against theory from the first checkpoint (claims 3-4).  Each judged model is measured
on as many held-out prompts as reject its comparisons' wrong predictions (:func:`sized`, within the
request's caps); a comparison not made is a row saying why, and a result that agrees but cannot
decide is undecided (:func:`judged_result`), never passed.  A single checkpoint cannot show that its
loss had stopped falling: without a trajectory (or ``assume_converged``, the researcher's statement)
a model is not shown converged.  Units: this project's loss sums over the m tasks and t = lr x steps;
torch's MSELoss averages over them, so one of its steps at lr is one of ours at lr/m.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Optional

from claims.core import ClaimResult, ClaimSpec, Context, Outcome, no_progress, run_status
from claims.audit.model import (MAX_PROMPTS, MAX_SECONDS, PILOT_PROMPTS, Audit, AuditPlan, AuditRequest,  # noqa: F401
                                 Case, ModelCase, _model_entry, check_fixed_point_loss, convergence, domain,
                                 evaluate_model, model_findings, plan_audit, prompts_needed, sized, sized_count)
from claims.audit.trajectory import (TrajectoryCase, evaluate_trajectory, prepare_trajectory,  # noqa: F401
                                      trajectory_domain, trajectory_findings)
from numerics import external
from numerics.reference_points import references


# --------------------------------------------------------------------------- the whole audit

def run_audit(plan: AuditPlan, progress=no_progress, references_by_heads: Optional[dict] = None,
              outcomes: Optional[list] = None, cut_short: Optional[str] = None) -> Audit:
    """Measure every checkpoint (on ``prompts``, or a pilot of PILOT_PROMPTS that :func:`sized` sizes
    each judged model from), compute theory's points once per H, and judge (module docstring).  For a
    caller that audits models it trained itself (claims.authors_replica): ``references_by_heads``
    ({H: numerics.reference_points.references}) theory's points already computed; ``outcomes``: a
    list that receives (result id, kind, Outcome) of each result before the judge; ``cut_short``: why
    the run was stopped early by design: then convergence is not asked (a plateau looks converged),
    nor whether it learned something (:attr:`ModelCase.learned_check`), nor claims 3-4 (theory's
    flows are the costliest part, and a run cut short cannot resolve its phase ends)."""
    total, req, n, stages = _stopwatch(), plan.request, len(plan.cases), {}
    n0 = req.prompts or min(PILOT_PROMPTS, int(req.max_prompts))
    measurements = []
    for k, case in enumerate(plan.cases):
        progress(f"checkpoint {k + 1}/{n}: readout and held-out loss ({n0} prompts)", 0.6 * k / n)
        measurements.append(external.measure(case.ext, case.cfg, n=n0, seed=req.seed))
    stages["measure"] = {"seconds": sum(m.seconds for m in measurements),
                         "cpu_seconds": sum(m.cpu_seconds for m in measurements)}
    refs_by_heads, clock = dict(references_by_heads or {}), _stopwatch()
    for H in sorted({c.cfg.heads for c in plan.cases} - set(refs_by_heads)):
        refs_by_heads[H] = references(plan.problem["tasks"], H, plan.problem["L"], plan.problem["sigma"], req.seed,
                                      req.device, dict(req.search),
                                      lambda msg, f: progress(msg, 0.6 + 0.3 * f), skip=tuple(req.skip))
    stages["theory"] = clock()
    judged = [len(plan.cases) - 1] if plan.trajectory else list(range(n))
    conv = (convergence(plan, measurements) if cut_short is None
            else (None, f"not asked: the run was cut short ({cut_short})", None))
    clock = _stopwatch()
    results, entries = [], []
    for k, (case, meas) in enumerate(zip(plan.cases, measurements)):
        rid = status = None
        if k in judged:
            rid = f"model-{len(results) + 1}"
            progress(f"{rid}: comparisons", 0.9)
            mc = ModelCase(case, meas, refs_by_heads[case.cfg.heads], conv, cut_short is None)
            mc = mc if req.prompts else sized(mc, req, progress)
            meas = mc.meas
            # the kind (claim or boundary) is the model's standing, from its readout, before any comparison
            st, _ = run_status(case.cfg, {"omega": meas.omega, "allocation": meas.allocation,
                                          "converged": bool(conv[0])}, domain(case.cfg, meas))
            fixed_ok = mc.refs.get("allocated_fixed_point", {}).get("available", False)
            spec = ClaimSpec(id=rid, title=f"Audit of {case.ext.summary()['name']}",
                             statement=("Theory's account of one handed model: inside the allocated account (on D, "
                                        "allocated, converged) its loss and served (omega, mu) are the exact allocated "
                                        "fixed point's; outside, it lies on the side theory says."), profiles={},
                             evaluate=evaluate_model, kind="claim" if st == "inside" and fixed_ok else "boundary",
                             findings=model_findings)
            results.append(judged_result(spec, mc, req, outcomes))
            status = results[-1].details.get("status", st)
        entries.append(_model_entry(case, meas, refs_by_heads[case.cfg.heads], rid, status,
                                    {"value": conv[0], "how": conv[1], "descent": conv[2]} if k in judged else None))
    if plan.trajectory and cut_short is None:
        progress("trajectory: claims 3-4 on this run", 0.95)
        prepared = prepare_trajectory(plan, measurements)
        prepared["fixed_point"] = refs_by_heads[plan.cases[0].cfg.heads].get("allocated_fixed_point")
        spec = ClaimSpec(id="trajectory", title="Claims 3-4 on this run (phases and winners)",
                         statement=("From the first checkpoint, theory predicts the run's warm-up and emergence times "
                                    "(claim 3) and the head each task ends on (claim 4)."), profiles={},
                         evaluate=evaluate_trajectory, kind="claim" if prepared["domain"]["inside"] else "boundary",
                         findings=trajectory_findings)
        results.append(judged_result(spec, TrajectoryCase(plan, tuple(measurements), prepared), req, outcomes))
    stages["compare"] = clock()
    progress("done", 1.0)
    return Audit(results=results, model=entries, stages=stages, **total())


def _stopwatch():
    """A clock started now: calling it gives the wall and CPU seconds since."""
    wall, cpu = time.perf_counter(), time.process_time()
    return lambda: {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu}


def judged_result(spec: ClaimSpec, profile, req: AuditRequest, outcomes: Optional[list]) -> ClaimResult:
    """``spec`` run on ``profile`` by the one runner, judged as its kind (claims.core.judge: comparisons
    that all agree but cannot decide -- none made, a wrong prediction not rejected, the sized count past
    the cap -- read ``undecided``, with the reason).  ``outcomes`` (:func:`run_audit`) receives
    (id, kind, Outcome)."""
    def evaluate(ctx):
        out = spec.evaluate(ctx)
        if outcomes is not None:
            outcomes.append((spec.id, spec.kind, out))
        return out
    return dataclasses.replace(spec, evaluate=evaluate).run(profile=profile, device=req.device, seed=req.seed)
