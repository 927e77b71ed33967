"""Where the paper's assumptions stop, on the exact finite-L reduced model: fewer heads than
tasks, judged against theory's own account of its regime (``located``: measured, and theory's
account agrees; ``contradicted``: it disagrees; a measurement that cannot decide:
``undecided``).  The merged parametrisation: ``claims.boundary_merged_superposition``; the
expansion's own limits: ``claims.boundary_saturation``, ``claims.boundary_small_L``.

``boundary-fewer-heads`` (:func:`check_fewer_heads`): H < m; each task ends on the head
theory's flow predicts, at the minimum of the exact loss over that partition.

"Serves several tasks" is numerics.evaluate's share (SUPERPOSED_SHARE, argued there).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from claims.core import (Z_SE, ClaimSpec, Comparison, Outcome, Tolerance, config_label, finding, head_task_heatmap,
                         headline_row, perturbation, replace_fields, resolved, term, theory_need)
from numerics.config import ProblemConfig
from numerics.engine import need
from numerics.model import initial_values
from numerics.evaluate import SUPERPOSED_SHARE, allocation, mean_se, window_drift
from numerics.train import TrainConfig


@dataclass(frozen=True)
class FewerHeadsProfile:
    tasks: tuple = (2, 2, 2)   # block sizes (m > H)
    heads: int = 2             # H < m
    L: int = 64                # context length
    init_seed: int = 1         # random decomposable init (a symmetric init keeps ties)
    lr: float = 0.1            # GD step of the exact reduced flow
    # t = 120: a head's omega on the tasks it does not serve decays only like 1/t under the
    # factored metric (d omega/dt ~ -omega^2) and costs loss ~ omega^2
    time: float = 120.0
    batch: int = 512           # fresh prompts per step
    n_eval: int = 40000        # held-out Rao-Blackwellised prompts
    sigma: float = 0.0         # label noise


FEWER = {
    # init seed 6: theory's flow has decided every task by t = 40 (runner-up shares <= 0.004)
    "tiny": FewerHeadsProfile(tasks=(1, 1, 1), L=32, init_seed=6, lr=0.2, time=40.0, batch=256, n_eval=8000),
    "quick": FewerHeadsProfile(),
    "paper": FewerHeadsProfile(tasks=(4, 4, 4, 4), L=256, lr=0.05, time=200.0, batch=2048, n_eval=200000),
}


def fewer_heads_error(loss_trained: float, loss_predicted: float, measured_winners, predicted_winners,
                      judge_winners: bool) -> float:
    """The one comparison of the fewer-heads boundary: inf when the winners are judged and
    differ from the predicted ones, else |trained - predicted loss|."""
    if judge_winners and list(measured_winners) != list(predicted_winners):
        return math.inf
    return abs(loss_trained - loss_predicted)


def fewer_needs(cfg, tcfg, n_eval: int) -> tuple:
    """(flow, theory's winners, theory's expansion flow to the run's end, the flow's end read
    out): the exact reduced flow (cfg.param) with H < m heads from cfg's init, theory's
    predictions from the same init, and the trained point, the partition minimum of theory's
    winners and the m-head allocated minimum on the same held-out prompts
    (``numerics.experiments.probes.fewer_heads_end``).  Refused for H >= m before any run."""
    if cfg.heads >= cfg.m:
        raise ValueError(f"the fewer-heads boundary needs fewer heads than tasks, got heads={cfg.heads} >= m={cfg.m}")
    om0, mu0 = (tuple(map(tuple, a.tolist())) for a in initial_values(cfg))
    start = (om0, mu0, tuple(cfg.tasks), int(cfg.L), float(cfg.sigma), cfg.param, float(cfg.logit_scale))
    flow, winners = need("reduced_flow", cfg=cfg, tcfg=tcfg), theory_need("predicted_winners", *start)
    return (flow, winners, theory_need("expansion_flow", *start, float(tcfg.time), (0.0, float(tcfg.time))),
            need("fewer_heads_end", flow=flow, winners=winners, cfg=cfg, n_eval=int(n_eval)))


def check_fewer_heads(cfg, n_eval: int, flow, winners, end_flow, run) -> Comparison:
    """The exact reduced flow (cfg.param) with H < m heads from cfg's init (``flow``), read out
    by ``run`` (:func:`fewer_needs`), against theory's ``winners`` and its expansion flow to the
    run's end ``end_flow``.

    Predicted (theory.task_allocation.predicted_winners: the expansion flow from the same
    init): the head carrying each task, and the trained loss equal to the minimum of the exact
    loss over that partition (each head serving its own tasks).  Compared by
    :func:`fewer_heads_error`; the winners are judged when every race is decisive
    (SUPERPOSED_SHARE, numerics.evaluate, on theory's flow to the
    run's end time, decided before the run), otherwise recorded.  Tolerance, from the
    run alone: Z_SE sqrt(2) standard errors of the trained point's held-out loss (the
    difference of two such estimates; not the paired SE, which grows when the prediction is
    wrong), plus the drift of the training loss over its final window, plus the step-size
    fluctuation left in the averaged iterate.  Perturbations through the same function:
    "one head per task" (the m-head allocated limit's loss) and permuted winners."""
    om0, mu0 = initial_values(cfg)
    # per task the runner-up head's share of the largest |mu| at the end of theory's expansion flow
    winners, end_shares = [int(h) for h in winners], list(allocation(None, np.abs(end_flow.final_mu)).runner_up_share)
    decisive = all(sh <= SUPERPOSED_SHARE for sh in end_shares)
    om_avg, mu_avg, losses, part, alloc = run.omega, run.mu, run.losses, run.partition, run.allocated
    measured_winners = list(allocation(None, mu_avg).serving_head)
    trained, se_trained = mean_se(losses[0])
    predicted_loss = float(losses[1].mean())
    fluctuation = max(0.0, float(losses[3:].mean() - trained)) / run.averaged_records
    drift = window_drift(np.asarray(flow.losses)[-max(2, int(math.ceil(0.1 * flow.steps))):], Z_SE)
    tolerance = Tolerance((term(f"{Z_SE:g} x sqrt(2) standard errors of the trained point's loss ({se_trained:.3g}, "
                                f"{n_eval} held-out prompts)", Z_SE * math.sqrt(2.0) * se_trained),
                           term("the final-window drift", drift),
                           term("the step-size fluctuation of the averaged iterate", fluctuation)),
                          f"winners judged: {decisive}")
    tol = tolerance.value
    err = fewer_heads_error(trained, predicted_loss, measured_winners, winners, decisive)
    permuted = [(h + 1) % cfg.heads for h in winners]
    shares = list(allocation(None, mu_avg).runner_up_share)
    return resolved(Comparison(
        name=f"H < m: tasks={list(cfg.tasks)}, H={cfg.heads}, L={cfg.L}",
        measured={"loss_trained": trained, "winners": measured_winners},
        predicted={"loss_partition_minimum": predicted_loss, "winners": winners},
        error=err, tolerance=tol, why=tolerance.why(),
        perturbations=[perturbation("one head per task (the m-head allocated limit's loss)",
                                    fewer_heads_error(trained, float(losses[2].mean()), measured_winners, winners,
                                                      decisive), tol, predicted=float(losses[2].mean()))]
        # (with one head there is no other winner to permute to)
        + ([perturbation("winners permuted (head h -> h + 1 mod H)",
                         fewer_heads_error(trained, predicted_loss, measured_winners, permuted, decisive),
                         tol, predicted=permuted)] if cfg.heads > 1 else []),
        details={"config": cfg.to_dict(), "train": flow.train.to_dict(), "omega0": om0.tolist(), "mu0": mu0.tolist(),
                 "predicted_shares_at_end": end_shares, "winners_judged": decisive, "se_trained": se_trained,
                 "omega": np.round(om_avg, 4).tolist(), "mu": np.round(mu_avg, 4).tolist(),
                 "second_share": shares, "averaged_records": run.averaged_records, "drift": drift, "fluctuation": fluctuation,
                 "partition_minimum": part.summary(), "allocated_with_m_heads": alloc.summary(),
                 "loss_ratio_to_allocated": float(trained / losses[2].mean())}, config=config_label(cfg)),
        error=lambda m, p: fewer_heads_error(m["loss_trained"], p["loss_partition_minimum"], m["winners"],
                                             p["winners"], decisive))


def _fewer_case(ctx) -> tuple:
    """(cfg, tcfg) of the fewer-heads boundary at ctx's profile (the flow's prompt stream is its need's)."""
    p = ctx.p
    return (ProblemConfig(tasks=p.tasks, heads=p.heads, L=p.L, sigma=p.sigma, init="random_decomposable",
                          init_seed=p.init_seed, device=ctx.device),
            TrainConfig(lr=p.lr, time=p.time, batch=p.batch, records=21))


def plan_fewer(ctx, results=None) -> list:
    cfg, tcfg = _fewer_case(ctx)
    return list(fewer_needs(cfg, tcfg, ctx.p.n_eval))


def compare_fewer(ctx, results) -> Outcome:
    cfg, tcfg = _fewer_case(ctx)
    comp = check_fewer_heads(cfg, ctx.p.n_eval, *(results[n] for n in fewer_needs(cfg, tcfg, ctx.p.n_eval)))
    head = [headline_row(comp, "trained loss vs partition minimum", theory=comp.predicted["loss_partition_minimum"],
                         measured=comp.measured["loss_trained"], se=comp.details["se_trained"]),
            headline_row(comp, "winners (head of each task)", theory=comp.predicted["winners"],
                         measured=comp.measured["winners"], tolerance=0.0)]
    figs = [head_task_heatmap(f"fewer-heads-{k}", f"H={cfg.heads} < m={cfg.m}: final {k}[h, i]", comp.details[k])
            for k in ("omega", "mu")]
    return Outcome([comp], head, figs, details={
        "ran": f"exact reduced flow ({cfg.param}), tasks={list(cfg.tasks)}, H={cfg.heads}, L={cfg.L}, "
               f"sigma={cfg.sigma:g}, random decomposable init seed {cfg.init_seed}",
        "domain": {"H < m": True, "decided_share": SUPERPOSED_SHARE,
                   "theory's runner-up shares at the run's end": comp.details["predicted_shares_at_end"],
                   "winners judged": comp.details["winners_judged"]}})


def findings_fewer(result) -> list:
    c = result.details["comparisons"][0]
    d = c["details"]
    return [finding(result, "stops", "With fewer heads than tasks ({cfg}) the trained reduced flow ends at loss {lt} "
                    "against the minimum over theory's partition {lp} (winners {w}, theory {wt}), {ratio} times the "
                    "m-head allocated loss.", cfg=c["config"], lt=(c["measured"]["loss_trained"], d["se_trained"]),
                    lp=c["predicted"]["loss_partition_minimum"], w=str(c["measured"]["winners"]),
                    wt=str(c["predicted"]["winners"]), ratio=d["loss_ratio_to_allocated"])]


def _fewer_cannot(problem):
    tasks = problem.get("tasks", (2, 2, 2))
    if problem.get("heads", 2) >= len(tasks):
        return f"it needs fewer heads than tasks, got heads={problem.get('heads', 2)} >= m={len(tasks)}"
    return None


KEYS = ("tasks", "heads", "L", "sigma")
SPEC = ClaimSpec(
    id="boundary-fewer-heads", kind="boundary", title="Boundary: fewer heads than tasks (H < m)",
    statement=("With H < m heads each task ends on the head theory's flow predicts, at the loss of that task "
               "partition (above the m-head allocated limit)."),
    profiles=FEWER, plan=plan_fewer, compare=compare_fewer, resolve=lambda p, pr: replace_fields(p, pr, KEYS),
    fields=KEYS, cannot_run=_fewer_cannot, findings=findings_fewer)
