"""Audit a model trained by anyone: checkpoints in, the same kind of report out.

    python -m reports.audit CHECKPOINT [CHECKPOINT ...] --tasks R,R,.. --L L [--sigma S]
        [--basis identity|random] [--basis-seed N] [--layout auto|authors|project|factored|merged]
        [--logit-scale s] [--times T,T,.. | --steps N,N,.. --lr LR [--loss-units mean|sum]]
        [--prompts N | --max-prompts N --max-minutes M] [--seed N] [--assume-converged] [--device cpu|cuda]
        [--out DIR]

This module parses the command line, checks every argument and every file before any
computation (``claims.audit.plan_audit``: each checkpoint read safely and mapped by
``numerics.external``), runs the audit (``claims.audit.run_audit``: numerics measures,
theory predicts, the claims module compares), and renders what it returns: ``DIR/claims.json``
(the main report's top level -- ``claims``, ``findings``, ``provenance`` -- plus ``model``, one
entry per checkpoint), ``DIR/index.html`` (``reports/templates/audit.html.j2``, autoescaped) and
``DIR/figures/*.png`` (drawn here from claims.json's numbers).  It computes nothing of its own.  The output
directory follows ``reports.build``'s policy (``reports.build.check_out_dir``: checked before any compute,
written whole into a temporary directory, checked, then swapped in; a directory holding anything
but a previous report is refused, never deleted).  docs/audit.md has the layouts, the units and
every field of ``model``.

Exit status: 0 when no judged claim fails or errors and no boundary is contradicted or errors
(an ``undecided`` result of either kind, which says what would decide it, included), 1 otherwise, 2 on bad arguments or an unreadable checkpoint (nothing computed, nothing written),
130 when interrupted (nothing written).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import io
import json
import math
import platform
import signal
import sys
import textwrap
import time
import warnings
from typing import Optional, TextIO

from numerics.io import (MEMORY_FRACTION, OFFSET_SEED_MAX, check_device_option, command_line, float_option, int_option,
                         jsonable, memory_available, seed_option, tasks_option, threads_option)
from reports.build import (ClaimProgress, _duration, _version, check_out_dir, exit_status, git_state, recover_leftovers,
                           refuse_arguments, write_files)
from reports.render import VERSIONED_PACKAGES, BadArguments, data_uri, environment, pyplot

DEFAULT_OUT = "reports/audit"
EXIT_BAD_ARGUMENTS, EXIT_INTERRUPTED = 2, 130   # and the build's exit_status: 0, or 1 on a failing result
TEMPLATE = "audit.html.j2"
MAX_PROMPTS = 2 ** 24


def _list_of(option):
    """argparse ``type=`` of a comma-separated list, each entry checked by ``option`` (one of
    numerics.io's: digits only, no underscores, finite, in range)."""
    return lambda text: tuple(option(p.strip()) for p in str(text).split(","))


def _skip(text: str) -> tuple:
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("--skip needs reference names, e.g. --skip one-head-optimum")
    return tuple(p.replace("-", "_") for p in parts)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m reports.audit",
        description=textwrap.fill(
            "Audit one-layer multi-head softmax attention models trained anywhere against the theory of 'Training "
            "Dynamics of Multi-Head Softmax Attention for In-Context Learning' (COLT 2024): each model among theory's "
            "reference points, its readout and, where the paper's account applies, whether it agrees; several "
            "checkpoints of one run with times are a trajectory (claims 3-4). Writes DIR/claims.json, DIR/index.html, "
            "DIR/figures/. Exit status: 0 no judged claim fails or errors and no boundary is contradicted or errors, "
            "1 otherwise, 2 bad arguments or files, 130 interrupted.", width=92),
        epilog=textwrap.dedent("""\
            layouts (docs/audit.md shows the export from a generic PyTorch attention):
              authors   state_dict: q_proj/k_proj/v_proj.weight (H(d+m), d+m), o_proj.weight (m, H(d+m)),
                        no biases, logits scaled by (d+m)^-1/2 (the authors' MultiHeadAttention)
              project   a numerics.train checkpoint, or its run.json (readout only: no weights)
              factored  .safetensors/.npz arrays K, Q (H,k,d+m), V (H,k',d+m), O (H,m,k') and logit_scale
              merged    .safetensors/.npz arrays W (H,d+m,d+m), U (H,m,d+m)
              auto      by keys and shapes (the default; the report says what it picked)
            units: this project's loss sums the squared error over the m tasks and its time is t = lr x
            steps; torch's MSELoss (the authors' script) averages over the m tasks, so with --loss-units
            mean (the default) t = lr x steps / m."""),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT",
                   help="checkpoint files (torch state_dict, .safetensors, .npz, numerics.train checkpoint or run.json)")
    _problem_arguments(p)
    _time_arguments(p)
    _measuring_arguments(p)
    g = p.add_argument_group("output")
    g.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"report directory (default {DEFAULT_OUT}/); replaced atomically, and only if it is new, empty "
                        "or a previous report holding nothing else")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def _problem_arguments(p: argparse.ArgumentParser) -> None:
    """The problem the models were trained on, and how their files hold the weights."""
    g = p.add_argument_group("the problem the models were trained on (a project file carries its own)")
    g.add_argument("--tasks", type=tasks_option(), default=None, metavar="R,R,..",
                   help="block sizes r_i of the m tasks (d = sum r_i); the authors' d = 50 over 3 tasks is 16,17,17")
    g.add_argument("--L", type=int_option("--L", 1), default=None, metavar="L", help="context length L")
    g.add_argument("--sigma", type=float_option("--sigma", low=0.0, allow_low=True), default=None, metavar="S",
                   help="label noise standard deviation (default 0)")
    g.add_argument("--basis", choices=("identity", "random"), default=None,
                   help="task basis Phi: contiguous blocks (the authors') or the seeded random one (default identity)")
    g.add_argument("--basis-seed", type=seed_option("--basis-seed"), default=None, metavar="N",
                   help="seed of the random basis (with --basis random)")
    g = p.add_argument_group("reading")
    g.add_argument("--layout", choices=("auto", "authors", "project", "factored", "merged"), default="auto",
                   help="how the files hold the weights (default auto: by keys and shapes)")
    g.add_argument("--logit-scale", type=float_option("--logit-scale", low=0.0), default=None, metavar="s",
                   help="s of W_h = K_h^T Q_h / s for a factored file that does not store logit_scale")


def _time_arguments(p: argparse.ArgumentParser) -> None:
    """The checkpoints' training times: several with times are one run, a trajectory."""
    g = p.add_argument_group("training times (several checkpoints with times are one run: a trajectory)")
    g.add_argument("--times", type=_list_of(float_option("--times", low=0.0, allow_low=True)), default=None, metavar="T,T,..",
                   help="training time of each checkpoint in this project's units (t = lr x steps, loss summed over tasks)")
    g.add_argument("--steps", type=_list_of(int_option("--steps", 0)), default=None, metavar="N,N,..",
                   help="the trainer's step of each checkpoint (with --lr); a file's own step entry is used without it")
    g.add_argument("--lr", type=float_option("--lr", low=0.0), default=None, metavar="LR",
                   help="the trainer's SGD step size (converts steps into times)")
    g.add_argument("--loss-units", choices=("mean", "sum"), default="mean",
                   help="how the trainer's loss treated the m tasks: mean (torch MSELoss, the authors: t = lr steps / m) "
                        "or sum (this project's: t = lr steps); default mean")


def _measuring_arguments(p: argparse.ArgumentParser) -> None:
    """The held-out measurement: its size, cost limit, seed, skipped references, device."""
    g = p.add_argument_group("measuring")
    g.add_argument("--prompts", type=int_option("--prompts", 2, MAX_PROMPTS, "more prompts than that take hours"),
                   default=None, metavar="N", help="held-out prompts per model, as given (default: sized: a pilot of "
                   "4096 prompts says how many reject the wrong predictions, within the two caps below)")
    g.add_argument("--max-prompts", type=int_option("--max-prompts", 2, MAX_PROMPTS, "more prompts than that take hours"),
                   default=None, metavar="N", help="the most held-out prompts a sized model is measured on (default "
                   "1048576)")
    g.add_argument("--max-minutes", type=float_option("--max-minutes", low=0.0), default=None, metavar="M",
                   help="the most minutes the audit may take (default 10); its cost is estimated before anything runs "
                   "(printed) and refused past M; a sized model's further prompts are capped at M minutes each at the "
                   "pilot's rate: past either cap a model that agrees is undecided, and the report says how many "
                   "prompts would decide it")
    g.add_argument("--seed", type=seed_option("--seed", OFFSET_SEED_MAX), default=0, metavar="N",
                   help="seed of the held-out prompts and of theory's searches, 0 .. 2^63 - 1 (same seed: same "
                        "numbers)")
    g.add_argument("--skip", type=_skip, default=(), metavar="REF[,REF]",
                   help="reference points not to compute (allocated-fixed-point, one-head-optimum, best-decomposable, "
                        "linear-attention); the report says they were skipped. The one-head optimum and the best "
                        "decomposable search are the costly ones")
    g.add_argument("--assume-converged", action="store_true",
                   help="state that each checkpoint's run had converged (its loss no longer falling): recorded as your "
                        "statement; one checkpoint cannot show it, and a model is compared with a minimiser only then")
    g.add_argument("--device", default="cpu", metavar="cpu|cuda|cuda:N", help="torch device of the held-out evaluation")
    g.add_argument("--threads", type=threads_option("--threads"), default=1, metavar="N",
                   help="torch CPU threads (default 1: the project's policy; on a shared machine two intra-op threads "
                        "stall each other about tenfold on these batches)")


def request_from_args(args):
    """The claims layer's AuditRequest of parsed arguments (checked there)."""
    from claims.audit import AuditRequest

    given = ("tasks", "L", "sigma", "basis", "basis_seed", "layout", "logit_scale", "times", "steps", "lr", "loss_units",
             "prompts", "seed", "assume_converged", "device", "skip")
    return AuditRequest(checkpoints=tuple(args.checkpoints), **{k: getattr(args, k) for k in given},
                        **({} if args.max_prompts is None else {"max_prompts": args.max_prompts}),
                        **({} if args.max_minutes is None else {"max_seconds": 60.0 * args.max_minutes}))


def _validate(args) -> tuple:
    """(plan, out, cost): every check before the audit's computation (the budget's probes take
    seconds at most: :func:`budget`); BadArguments on anything wrong."""
    from claims.audit import plan_audit
    from numerics import external

    if args.prompts is not None and args.max_prompts is not None:
        raise BadArguments("--prompts N is measured as given; --max-prompts caps a sized measurement: give one or the "
                           "other")
    if args.basis_seed is not None and args.basis != "random":
        raise BadArguments("--basis-seed is used only with --basis random; drop it or add --basis random")
    try:        # numerics.external.CheckpointError and BadArguments are ValueErrors
        check_device_option(args.device)
        external.check_paths(args.checkpoints)      # a link loop, a FIFO, a device: refused before any read
        out = check_out_dir(args.out, "--out", args.checkpoints)
        plan = plan_audit(request_from_args(args))
        cost = budget(plan)
        check_budget(cost, plan.request.max_seconds, args.max_minutes is not None)
        for case in plan.cases:         # every checkpoint's weights give numbers (the budget's probes: the first)
            if id(case) not in cost["checked"]:
                check_finite(case, plan.request.seed)
    except ValueError as exc:
        raise BadArguments(str(exc)) from None
    return plan, out, cost


# --------------------------------------------------------------------------- the budget

PROBE_PROMPTS = 32
# The timing probe: the first checkpoint of each shape measured on 2 and on 2 + PROBE_PROMPTS
# held-out prompts gives the measurement's fixed and per-prompt seconds on this machine, now (well
# under a second at the 10,000 heads; the refusal it informs would have cost minutes).

MIN_SPAN = 1e-6
# The least span t_end - t_0 of a trajectory whose theory is computed, in this project's units
# (t = lr x steps).  Theory's flow from the first checkpoint is integrated over that span by scipy's
# LSODA, which never ends on spans near the bottom of the float range (measured: 1e-100 ends in 2 s,
# 1e-200 and denormal spans never); 1e-6 is a thousand steps at lr 1e-9, a run that moves no weight
# visibly, and is far from that range.

SEARCH_ELEMENT_SECONDS, SEARCH_EVALUATIONS = 6.5e-8, 100
# The best decomposable search (numerics.experiments.probes.best_decomposable): per start at most
# SEARCH_EVALUATIONS evaluations (L-BFGS-B's maxiter) of a fit sample of n prompts, each touching
# n H (L + H) m numbers (per task, the scores and the heads' pair moments), at
# SEARCH_ELEMENT_SECONDS each: above the 1.2e-8 .. 6.2e-8 s measured here (one thread) at (2,) L = 8
# with H = 4, 16, 64, at (2, 2) L = 32 H = 2 and at (16, 17, 17) L = 100 H = 3 (4-82 s).  Its memory:
# the pair moments, n H^2 numbers, held about three times.

FIXED_POINT_SECONDS, ONE_HEAD_SECONDS, ONE_HEAD_PER_R2 = 6.0, 12.0, 0.35
# Theory's other points, measured here (docs/audit.md's Cost): the allocated fixed point 0.2-6 s;
# the one-head optimum 12 s (its symbolic derivation, once per process) plus 0.35 s x (largest r)^2
# (3.4-11 s at r = 2, 85 s at r = 17, 110 s at the authors' (16, 17, 17)); linear attention is
# closed-form.

RENDER_SECONDS, RENDER_SECONDS_PER_BAR = 0.3, 0.01
# The report's share per judged result: its two or three figures drawn and written, one bar per head
# and task among them (measured: 0.22 s a result over 200 judged checkpoints of H = 2; about 100 s for
# one of H = 10,000).

PROBE_STEPS = 256
# Steps of theory's gradient-descent map timed for a trajectory's estimate (0.05-0.1 s; the rate of
# the first thousands of steps, measured 1.6e-4 - 2.7e-4 s a step at (2, 2), H = 2).

TRAJECTORY_FLOW_SECONDS = 5.0
# Theory's flow of a trajectory besides its gradient-descent map (the ODE and the winners): 2-3 s measured.


def check_finite(case, seed: int):
    """The 2-prompt measurement of ``case``, or :class:`BadArguments` (one line, nothing audited)
    when the handed weights give NaN or inf: merged weights W_h = K_h^T Q_h / s that overflow
    (entries of 1e154, a tiny logit scale), or a loss on held-out prompts that does (the logits or
    outputs overflow).  Such weights are a bad input, like an unreadable file: a model whose loss
    is not a number cannot be placed, compared or drawn, and an error verdict would say that a
    check failed."""
    import numpy as np

    from numerics import external
    from numerics.model import TrainingDiverged

    ext, what = case.ext, None
    try:
        with warnings.catch_warnings():         # numpy's overflow warnings: the line below says it once
            warnings.simplefilter("ignore", RuntimeWarning)
            meas = external.measure(ext, case.cfg, n=2, seed=seed)
        bad = [e.mean for e in (meas.loss, meas.projected_loss) if e is not None and not math.isfinite(e.mean)]
        readout = [meas.omega, meas.mu] + ([meas.residual] if meas.residual is not None else [])
        if not all(np.all(np.isfinite(x)) for x in readout):
            what = "the readout of their merged weights is not finite (entries too large to square)"
        elif bad:
            what = f"their loss on 2 held-out prompts is {bad[0]} (the logits or outputs overflow)"
    except TrainingDiverged:
        meas, what = None, "their merged weights W_h = K_h^T Q_h / s and U_h = O_h V_h are not finite"
    if what:
        largest = max((float(np.max(np.abs(w))) for w in ext.weights.values() if np.size(w)), default=float("nan"))
        scale = f", logit scale {ext.logit_scale:.3g}" if ext.logit_scale is not None else ""
        raise BadArguments(f"{ext.path}: the handed weights give NaN/inf at L = {case.cfg.L}: {what} (largest handed "
                           f"entry {largest:.3g}{scale}); nothing was audited")
    return meas


def _probe(case, seed: int) -> tuple[float, float]:
    """(fixed seconds, seconds per held-out prompt) of measuring ``case`` here (:data:`PROBE_PROMPTS`)."""
    from numerics import external

    t0 = time.perf_counter()
    external.measure(case.ext, case.cfg, n=2, seed=seed)
    t1 = time.perf_counter()
    external.measure(case.ext, case.cfg, n=2 + PROBE_PROMPTS, seed=seed)
    t2 = time.perf_counter()
    return t1 - t0, max((t2 - t1) - (t1 - t0), 0.0) / PROBE_PROMPTS


def theory_cost(problem: dict, H: int, skip: tuple, search: dict) -> tuple[dict, int]:
    """({reference point: estimated seconds}, bytes) of theory's points at H (the constants above)."""
    tasks, L = problem["tasks"], problem["L"]
    seconds = {"allocated_fixed_point": FIXED_POINT_SECONDS,
               "one_head_optimum": ONE_HEAD_SECONDS + ONE_HEAD_PER_R2 * max(tasks) ** 2}
    n = max(128, int(search["fit_elements"]) // (H * L))
    seconds["best_decomposable"] = SEARCH_ELEMENT_SECONDS * (int(search["random_starts"]) + 1) * len(tasks) * (
        SEARCH_EVALUATIONS * n * H * (L + H) + int(search["eval_prompts"]) * H * L)
    memory = 0 if "best_decomposable" in skip else 3 * 8 * n * H * (L + H)
    return {k: v for k, v in seconds.items() if k not in skip}, memory


def trajectory_cost(plan, meas0) -> float:
    """Estimated seconds of theory's account of a trajectory (0 where it is not computed: outside
    the domain of claims.audit.trajectory_domain): its gradient-descent map takes
    (t_end - t_0) / lr steps, timed here on :data:`PROBE_STEPS` of them.  A span below :data:`MIN_SPAN` or more
    steps than the trainer's limit (numerics.train.MAX_STEPS) is :class:`BadArguments`."""
    import numpy as np

    from claims.audit import trajectory_domain
    from numerics.train import MAX_STEPS
    from theory.reduced_ode import expansion_gd_map

    if not plan.trajectory or not trajectory_domain(plan, meas0)["inside"]:
        return 0.0
    t = np.array([c.time for c in plan.cases], float)
    span, lr = float(t[-1] - t[0]), plan.lr if plan.lr is not None else float(np.min(np.diff(t))) / 100.0
    where = (f"the checkpoints' times span {span:.3g} in this project's units (t = lr x steps; "
             f"{plan.cases[0].time_source})")
    if not span >= MIN_SPAN:
        raise BadArguments(f"{where}, less than {MIN_SPAN:g}: no run that short moves its weights, and theory's flow "
                           "cannot be integrated over it; check --times, --lr and --loss-units")
    if not span / lr <= MAX_STEPS:
        step = f"--lr's {lr:.3g}" if plan.lr is not None else f"{lr:.3g}, a hundredth of the least gap (no --lr given)"
        raise BadArguments(f"{where}: {span / lr:.3g} gradient steps of {step}, more than the trainer's "
                           f"{MAX_STEPS:.0e} that theory's map of the run would take; check --times and --lr")
    c0 = plan.cases[0].cfg
    for k in (4, PROBE_STEPS):      # the first call builds theory's tables: the second is timed
        t0 = time.perf_counter()
        expansion_gd_map(meas0.omega, meas0.mu, c0.tasks, c0.L, c0.sigma, "factored", c0.logit_scale, lr,
                         t=[k * lr], on_exit="stop")
    return (time.perf_counter() - t0) / PROBE_STEPS * span / lr + TRAJECTORY_FLOW_SECONDS


def budget(plan) -> dict:
    """What the audit will cost, estimated before any of it is spent: {"seconds": {part: s},
    "memory": {part: bytes}, "free": bytes or None, "first": the first case's 2-prompt measurement,
    "checked": ids of the cases :func:`check_finite` passed}.
    Measurement: per checkpoint its first measurement (the pilot, or --prompts) at the probe's
    rates, twice more for a judged one (its gradient noise, the run's descent); a sized model's
    further prompts are capped apart (--max-minutes each).  Theory: :func:`theory_cost` per H and
    :func:`trajectory_cost`; the report: :data:`RENDER_SECONDS` (and per bar) per judged result.  Memory: the
    largest held-out batch (numerics.external.held_out_chunk, which refuses one that does not fit)
    and the search's pair moments."""
    from claims.audit import PILOT_PROMPTS
    from numerics import external
    from numerics.train import step_memory_bytes

    req = plan.request
    n0 = req.prompts or min(PILOT_PROMPTS, int(req.max_prompts))
    judged = {id(plan.cases[-1])} if plan.trajectory else {id(c) for c in plan.cases}
    groups: dict = {}
    for c in plan.cases:
        groups.setdefault((c.ext.heads, c.ext.param), []).append(c)
    seconds, memory, first, checked = {"measurement": 0.0}, {"held-out batch": 0, "search": 0}, None, set()
    for cases in groups.values():
        batch = step_memory_bytes(cases[0].cfg, external.held_out_chunk(cases[0].cfg))
        memory["held-out batch"] = max(memory["held-out batch"], batch)
        meas = check_finite(cases[0], req.seed)
        first = meas if cases[0] is plan.cases[0] else first
        checked.add(id(cases[0]))
        fixed, per = _probe(cases[0], req.seed)
        seconds["measurement"] += sum(fixed + n0 * per * (3 if id(c) in judged else 1) for c in cases)
    for H in sorted({c.cfg.heads for c in plan.cases}):
        parts, search_memory = theory_cost(plan.problem, H, tuple(req.skip), dict(req.search))
        memory["search"] = max(memory["search"], search_memory)
        for name, value in parts.items():
            seconds[name] = seconds.get(name, 0.0) + value
    seconds["trajectory"] = trajectory_cost(plan, first) if first is not None else 0.0
    seconds["report"] = RENDER_SECONDS * plan.trajectory + sum(
        RENDER_SECONDS + RENDER_SECONDS_PER_BAR * c.cfg.heads * c.cfg.m for c in plan.cases if id(c) in judged)
    return {"seconds": seconds, "memory": memory, "free": memory_available(), "first": first, "checked": checked}


def describe_budget(cost: dict) -> str:
    parts = ", ".join(f"{k.replace('_', ' ')} {_duration(v)}" for k, v in cost["seconds"].items() if v >= 0.5)
    free = f" of the {cost['free'] / 2 ** 30:.3g} GiB this process can take" if cost["free"] else ""
    return (f"estimated {_duration(sum(cost['seconds'].values()))} ({parts or 'each part under a second'}), memory "
            f"{max(cost['memory'].values()) / 2 ** 30:.2g} GiB{free}")


def check_budget(cost: dict, max_seconds: float, flag_given: bool) -> None:
    """:class:`BadArguments` when the estimate passes --max-minutes or half the memory this process
    can take (numerics.io.MEMORY_FRACTION), saying what raises or lowers it."""
    total, free, memory = sum(cost["seconds"].values()), cost["free"], cost["memory"]
    costly = sorted(k for k in ("one_head_optimum", "best_decomposable") if cost["seconds"].get(k, 0.0) > 60.0)
    skip = f", --skip {','.join(k.replace('_', '-') for k in costly)}" if costly else ""
    if free is not None and max(memory.values()) > MEMORY_FRACTION * free:
        what = ("theory's best decomposable search" if memory["search"] > memory["held-out batch"]
                else "the audit's held-out batch")
        raise BadArguments(f"{what} would need about {max(memory.values()) / 2 ** 30:.3g} GiB, more than "
                           f"half the {free / 2 ** 30:.3g} GiB this process can take; nothing was computed: use a "
                           f"machine with more memory" + (", or --skip best-decomposable" if memory["search"] >
                                                          memory["held-out batch"] else ""))
    if total > max_seconds:
        raise BadArguments(f"the audit is {describe_budget(cost)}: more than --max-minutes "
                           f"{max_seconds / 60:g}{'' if flag_given else ' (the default)'}; nothing was computed: raise "
                           f"--max-minutes{skip}, or give fewer --prompts or checkpoints")


# --------------------------------------------------------------------------- figures
# Drawn from the numbers of claims.json (nothing computed here), with the main page's pyplot
# (reports.render.pyplot: the Agg backend, imported when a figure is first drawn, so that refused
# arguments never load matplotlib); a figure that cannot be drawn raises, and the caller names it on the page.

REFERENCE_COLOURS = {"allocated_fixed_point": "tab:blue", "one_head_optimum": "tab:orange",
                     "best_decomposable": "tab:green", "linear_attention": "tab:purple"}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return buf.getvalue()


def _number(x):
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) else None


def bars_png(entry: dict) -> bytes:
    """omega and mu of one model entry, grouped by head, one bar per task."""
    om, mu = entry["readout"]["omega"], entry["readout"]["mu"]
    H, m = len(om), len(om[0])
    fig, axes = pyplot().subplots(1, 2, figsize=(9.5, 3.2))
    width = 0.8 / m
    for ax, values, what in ((axes[0], om, "omega[h, i] (QK)"), (axes[1], mu, "mu[h, i] (OV)")):
        for i in range(m):
            ax.bar([h + (i - (m - 1) / 2) * width for h in range(H)], [values[h][i] for h in range(H)], width,
                   label=f"task {i}")
        ax.axhline(0.0, color="black", lw=0.6)
        ax.set_xticks(range(H), [f"head {h}" for h in range(H)])
        ax.set_title(what)
    axes[1].legend(fontsize=8, loc="best")
    fig.suptitle(entry["checkpoint"]["name"], fontsize=10)
    return _png(fig)


def ladder_png(entry: dict) -> bytes:
    """The model's loss with its error bar (Z = 4 standard errors drawn as the bar, 1 as the box)
    among theory's reference points; a reference that could not be computed is named below."""
    from claims.audit.model import REFERENCE_NAMES

    loss = entry["held_out_loss"] or entry["projected_loss"]
    fig, ax = pyplot().subplots(figsize=(6.5, 3.6))
    missing = []
    for k, label in REFERENCE_NAMES.items():
        r = entry["theory"].get(k, {})
        if not r.get("available"):
            missing.append(label)
            continue
        y, se = r["loss"], r.get("se") or 0.0
        ax.axhline(y, color=REFERENCE_COLOURS[k], lw=1.4, label=f"{label}: {y:.4g}")
        if se:
            ax.axhspan(y - 4 * se, y + 4 * se, color=REFERENCE_COLOURS[k], alpha=0.15)
    ax.errorbar([0.0], [loss["mean"]], yerr=[[4 * loss["se"]], [4 * loss["se"]]], fmt="o", color="black",
                capsize=6, label=f"this model: {loss['mean']:.4g} ± {loss['se']:.2g} (bar: 4 se)")
    ax.set_xlim(-1.0, 1.0)
    ax.set_xticks([])
    ax.set_ylabel("loss (sum over the m tasks)")
    title = f"loss ladder: {entry['checkpoint']['name']}"
    if missing:
        title += f"\n(not computed: {', '.join(missing)})"
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return _png(fig)


def trajectory_png(t, loss, se, mu, theory=None, phases=None, title="") -> bytes:
    """Loss against time (points with 1 se bars, the measured phases shaded; ``theory``: its curve with
    its label, the exact fixed point's level and the judged phase ends, dashed with their tolerances
    shaded) and the OV values mu[h, i] against time."""
    fig, axes = pyplot().subplots(1, 2, figsize=(10.5, 3.6))
    ax = axes[0]
    if se is not None:
        ax.errorbar(t, loss, yerr=se, fmt="o", ms=3, label="held-out loss")
    else:
        ax.plot(t, loss, "o", ms=3, label="recorded loss")
    if phases and _number(phases.get("warmup_end")) is not None and _number(phases.get("emergence_end")) is not None:
        ax.axvspan(t[0], phases["warmup_end"], color="tab:gray", alpha=0.12, label="warm-up (measured)")
        ax.axvspan(phases["warmup_end"], phases["emergence_end"], color="tab:red", alpha=0.10, label="emergence")
    if theory:
        ax.plot(theory["t"], theory["loss"], "-", lw=1.2, color="tab:orange", label=theory["label"])
        if _number(theory.get("fixed_point")) is not None:
            ax.axhline(theory["fixed_point"], color="tab:blue", lw=1.0,
                       label=f"theory: exact allocated fixed point {theory['fixed_point']:.4g}")
        for k, (name, (tp, tol)) in enumerate(sorted(theory.get("phase_ends", {}).items())):
            ax.axvline(tp, color="black", ls="--", lw=0.9, label="theory's phase ends (judged)" if k == 0 else None)
            ax.axvspan(tp - tol, tp + tol, color="black", alpha=0.06)
    ax.set_xlabel("t (lr x steps, this project's units)")
    ax.set_ylabel("loss")
    ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    ax = axes[1]
    H, m = len(mu[0]), len(mu[0][0])
    for h in range(H):
        for i in range(m):
            ax.plot(t, [x[h][i] for x in mu], "-o", ms=2, lw=1, label=f"mu[{h},{i}]")
    ax.axhline(0.0, color="black", lw=0.6)
    ax.set_xlabel("t")
    ax.set_ylabel("mu (OV)")
    ax.legend(fontsize=6, ncol=max(1, m))
    fig.suptitle(title, fontsize=10)
    return _png(fig)


# --------------------------------------------------------------------------- rendering

def provenance(plan, audit, started: str, total: float, command: list, render_seconds: float) -> dict:
    req = plan.request
    return {
        "versions": {"python": platform.python_version(), **{p: _version(p) for p in VERSIONED_PACKAGES},
                     "safetensors": _version("safetensors")},
        "platform": platform.platform(), "device": req.device, "device_info": {"name": req.device},
        "seed": int(req.seed), "seeds": {"held_out": int(req.seed), "note": "the held-out prompts (numerics.evaluate's "
                                         "stream of this seed) and theory's searches"},
        "profile": "audit", "problem": {**plan.problem, "tasks": list(plan.problem["tasks"])},
        "request": jsonable(vars(req)),
        "trajectory": plan.trajectory, "not_a_trajectory": plan.why_not,
        "wall_seconds": {"per_claim": {r.id: r.seconds for r in audit.results}, "total": total,
                         "audit": audit.seconds, "stages": {k: v["seconds"] for k, v in audit.stages.items()},
                         "rendering": render_seconds},
        "cpu_seconds": {"per_claim": {}, "total": audit.cpu_seconds,
                        "stages": {k: v["cpu_seconds"] for k, v in audit.stages.items()}},
        "git": git_state(), "command": command, "started_utc": started,
    }


def _figure(files: dict, figures: list, name: str, title: str, caption: str, draw, errors: list) -> None:
    try:
        data = draw()
    except Exception as exc:   # a figure that cannot be drawn is named on the page, not fatal
        errors.append(f"{name}: {type(exc).__name__}: {str(exc)[:200]}")
        return
    file = f"figures/{name}.png"
    files[file] = data
    figures.append({"name": name, "title": title, "kind": "png", "caption": caption, "file": file})


def render(plan, audit, started: str, command: list, t0: float) -> tuple[dict, dict]:
    """(claims.json document, {file: bytes}) of a finished audit: entries of the results, the figures
    drawn from their numbers, the page."""
    t_render = time.perf_counter()
    files, entries = {}, []
    by_id = {e["judged"]: e for e in audit.model if e["judged"]}
    for r in audit.results:
        entry = r.to_dict()
        entry["figure_data"] = entry.pop("figures")
        figures, errors = [], []
        if r.id in by_id:
            m = by_id[r.id]
            _figure(files, figures, f"{r.id}-ladder", "loss ladder", "the model's held-out loss (bar: 4 standard "
                    "errors) among theory's reference points", lambda m=m: ladder_png(m), errors)
            _figure(files, figures, f"{r.id}-bars", "omega and mu by head and task", "per head, one bar per task: "
                    "an allocated model has one tall mu bar per head", lambda m=m: bars_png(m), errors)
            recs = m.get("records") or []
            if len(recs) >= 2:
                _figure(files, figures, f"{r.id}-records", "the file's own training records", "the loss recorded "
                        "by the trainer (one batch each) and mu against time, from the file",
                        lambda recs=recs: trajectory_png([x["t"] for x in recs], [x["loss"] for x in recs], None,
                                                            [x["mu"] for x in recs], title="the file's records"), errors)
        if r.id == "trajectory":
            theory = trajectory_theory(r.details)
            _figure(files, figures, "trajectory", "loss and OV values against time", "held-out loss of each checkpoint "
                    "(1 se bars), the measured phases shaded, theory's curve from the first checkpoint and its judged "
                    "phase ends (dashed, tolerance shaded) where it applies",
                    lambda d=r.details, th=theory: trajectory_png(d["t"], d["loss"], d["se"], d["mu"], th,
                                                                      d.get("measured_phases"), "trajectory"), errors)
        entry.update(figures=figures, figure_errors=errors)
        entries.append(entry)
    doc = {"claims": entries, "findings": [f for e in entries for f in e.get("findings") or []],
           "model": jsonable(audit.model), "provenance": {}}
    doc["provenance"] = provenance(plan, audit, started, time.perf_counter() - t0, command,
                                   time.perf_counter() - t_render)
    doc = jsonable(doc)
    files["index.html"] = page(doc, files).encode("utf-8")
    files["claims.json"] = (json.dumps(doc, indent=2, allow_nan=False) + "\n").encode("utf-8")
    return doc, files


def trajectory_theory(d: dict) -> Optional[dict]:
    """What the trajectory figure draws of theory (from the result's details): the expansion flow from
    the first checkpoint, labelled with its offset from theory's exact allocated fixed point where that
    exceeds the loss comparison's tolerance; the exact fixed point's level; the judged phase ends with
    their tolerances."""
    if d.get("predicted_loss") is None:
        return None
    off = d.get("expansion_offset") or {}
    label = "theory: expansion flow from the first checkpoint"
    if off.get("beyond_tolerance") and off.get("relative") is not None:
        label += f" (its end {off['relative']:+.0%} off the exact fixed point)"
    elif off.get("beyond_tolerance"):
        label += f" (off theory's exact loss by {off['end_error']:.3g} at its end)"
    phase = next((c for c in d.get("comparisons", []) if c["details"].get("role") == "phase times"), None)
    ends = {} if phase is None else {k: (phase["predicted"][k], phase["details"]["tolerances"][k]["tolerance"])
                                     for k in ("warmup_end", "emergence_end")}
    return {"t": d["predicted_t"], "loss": d["predicted_loss"], "label": label, "fixed_point": off.get("exact"),
            "phase_ends": ends}


def page(doc: dict, files: dict) -> str:
    """index.html from the template, in the main page's environment (autoescaped; its ``anchor``
    gives the section ids check_report looks for); figures inline as data URIs."""
    env = environment().overlay(keep_trailing_newline=False)
    env.filters = {**env.filters, "num": _fmt, "decided": decided_by,
                   "pm": lambda e: "n/a" if not e else f"{_fmt(e['mean'])} ± {_fmt(e['se'], 2)}"}
    inline = {k: data_uri(v) for k, v in files.items() if k.endswith(".png")}
    return env.get_template(TEMPLATE).render(doc=doc, inline=inline, models={e["judged"]: e for e in doc["model"]
                                                                            if e["judged"]})


def _fmt(x, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_fmt(v, digits) for v in x) + "]"
    try:
        v = float(x) if not isinstance(x, (str, bool)) else None
    except (TypeError, ValueError):
        v = None
    return str(x) if v is None else f"{v:.{digits}g}" if math.isfinite(v) else str(v)


def decided_by(entry: dict) -> str:
    """The sentence that says what decided a result, with its numbers: the error, the undecided reason,
    or the comparison behind the verdict (the first that disagrees, else the closest to its tolerance)."""
    d = entry["details"]
    if d.get("error"):
        return f"the check raised {d['error']}"
    comps = d.get("comparisons") or []
    if entry["verdict"] == "undecided" or d.get("undecided") or not comps:
        return d.get("undecided") or ("a wrong prediction was not rejected" if comps else "no comparison was made")
    c = next((c for c in comps if not c["agrees"]), None) or max(comps, key=lambda c: c["margin"])
    return (f"{c['name']}: error {_fmt(c['error'], 3)} {'within' if c['agrees'] else 'beyond'} its tolerance "
            f"{_fmt(c['tolerance'], 3)}")


def summary(doc: dict) -> str:
    """The terminal's account: each result's verdict with what decided it and every comparison not
    made, then the judged checkpoints (earlier ones of a run are on the page), then the cost."""
    lines = []
    for c in doc["claims"]:
        what = "" if c["id"] == "trajectory" else f" ({c['details'].get('checkpoint', {}).get('name', '?')})"
        lines.append(f"{c['id']}{what}: {c['kind']} {c['verdict']}: {decided_by(c)}")
        lines += [f"  {r['name']}" for r in c["headline"] if r["name"].startswith("not compared")]
    earlier = [e for e in doc["model"] if not e["judged"]]
    for e in doc["model"]:
        if not e["judged"]:
            continue
        loss = e["held_out_loss"] or e["projected_loss"]
        fp = e["position"].get("allocated_fixed_point", {})
        lines.append(f"{e['checkpoint']['name']}: {e['readout']['words']}, loss {_fmt(loss['mean'])} ± "
                     f"{_fmt(loss['se'], 2)} on {loss['n']} prompts" + (f" = {_fmt(fp['ratio'])} x the allocated "
                                                                       "fixed point" if fp.get("available") else "")
                     + f" [{e['judged']}]")
    if earlier:
        lines.append(f"{len(earlier)} earlier checkpoint(s) of the run: on the page")
    w, cpu = doc["provenance"]["wall_seconds"], doc["provenance"]["cpu_seconds"]
    lines.append(f"audit took {w['total']:.1f} s wall, {cpu['total']:.1f} s CPU (theory {w['stages'].get('theory', 0):.1f} s "
                 f"wall, {cpu['stages'].get('theory', 0):.1f} s CPU)")
    return "\n".join(lines)


def layouts(cases: list) -> str:
    """How each file was read, one line per group of files read alike (a run's checkpoints are one):
    the count, the first and last file, the layout, H and the times' range and source."""
    groups: dict = {}
    for c in cases:
        groups.setdefault((c.ext.layout, c.ext.picked, c.ext.heads, c.ext.param, c.time_source), []).append(c)
    lines = []
    for (layout, picked, heads, param, source), cs in groups.items():
        files = cs[0].ext.path if len(cs) == 1 else f"{len(cs)} files, {cs[0].ext.path} .. {cs[-1].ext.path}"
        times = [c.time for c in cs if c.time is not None]
        lines.append(f"{files}: layout {layout} ({picked}), H = {heads}, {param}" + (
            f", t = {_fmt(min(times))}" + (f" .. {_fmt(max(times))}" if len(times) > 1 else "") + f" ({source})"
            if times else ""))
    return "\n".join(lines)


@command_line       # an ascii terminal, a closed pipe, a deleted directory, a full disk: as every command
def main(argv: Optional[list] = None, stream: Optional[TextIO] = None) -> int:
    stream = sys.stderr if stream is None else stream
    parser = make_parser()
    try:
        with contextlib.redirect_stderr(stream):    # argparse's own messages go where ours go
            args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_ARGUMENTS
    command = [sys.executable, "-m", "reports.audit"] + list(sys.argv[1:] if argv is None else argv)
    import torch

    torch.set_num_threads(args.threads)     # the budget's probes time what the audit will run
    try:
        plan, out, cost = _validate(args)
    except BadArguments as exc:
        return refuse_arguments(parser, stream, exc)
    print(layouts(plan.cases), file=stream, flush=True)
    print(f"audit: {describe_budget(cost)}", file=stream, flush=True)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    from reports.build import _main_thread, _raise_interrupt   # the build's SIGTERM handling, as it is

    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if _main_thread() else None
    t0 = time.perf_counter()
    bar = ClaimProgress("audit", stream, not args.no_progress, announce=False)
    try:
        from claims.audit import run_audit

        audit = run_audit(plan, bar)
        bar.close()
        doc, files = render(plan, audit, started, command, t0)
        recover_leftovers(out, stream)
        where = write_files(out, lambda: files, stream)
    except KeyboardInterrupt:
        bar.close()
        print(f"\ninterrupted: no report written; the previous report in {out} (if any) is intact", file=stream)
        return EXIT_INTERRUPTED
    except BadArguments as exc:     # --out changed while the audit ran: nothing deleted, nothing written beside it
        return refuse_arguments(parser, stream, exc)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(summary(doc))
    print(f"report: {where / 'index.html'}")
    return exit_status(doc)   # the build's rule: a failing or erring result, or a figure not drawn


if __name__ == "__main__":
    sys.exit(main())
