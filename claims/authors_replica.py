"""``authors-replica`` (issue 28): the authors' released experiment, trained here, audited by theory.

Their script trains one layer of H softmax heads at d_x = 50 over d_y tasks (their DataGenerator:
blocks 16, 17, 17 for d_y = 3, one block of 50 for d_y = 1), L = 100, torch SGD at lr 0.01 on MSELoss
over 10,000 fresh prompts a step, from nn.Linear's default initialisation; beside it they define a
small initialisation.  This id trains the eight runs {d_y = 3, 1} x {H = 3, 8} x {nn.Linear's
default (init ``linear_default``), their small init (``authors_small``)} with this project's trainer
(``numerics.experiments.authors``: numerics.train.train_many, one program per shape, the two starts
of a shape on one prompt stream) for the same number of their SGD steps, keeps checkpoints evenly
spaced in time, and hands every run's checkpoints to the audit of handed models
(``claims.model_audit``, the machinery of ``python -m reports.audit``: the same readout, held-out
loss, theory's reference points, comparisons and findings), one trajectory per run.

Units: their loss is ours / m (MSELoss averages over the m outputs), so S of their steps at lr are
t = lr S / m of this project's time; both are stated per run.

Kind: a boundary, decided from the plan before any run -- nn.Linear's default is off D (the
paper's "suitable initialisation" does not hold: boundary-initialisation), H = 8 > m and d_y = 1
lie outside claim 5's domain, and the small init's warm-up outlasts any run here (theory's
expansion flow from it ends its emergence at t ~ 10^3, hundreds of thousands of their steps); so
what is judged is each model's standing on the side theory puts it (claims.model_audit), and a
model inside the allocated account, if any, is compared two-sidedly there as in the audit.

Time.  Profile ``authors`` (= ``paper``) is the experiment at ``STATED_STEPS`` of their steps, sized
for one H200 within 5 minutes (docs/authors.md: the roofline estimate).  On a CPU it runs reduced
(as profile ``quick``): fewer steps, fewer checkpoints and held-out prompts, a note saying what was
reduced and what it means: every run is far from converged, so convergence is not asked (a plateau
would pass the descent test), a model on D is compared one-sidedly (not below the fixed point), a
model off D is not compared (undecided: the audit's "it learned something" check is asked of
trained models), the trajectories' claims 3-4 are not computed (claims.model_audit.run_audit's
``cut_short``), and the outcome is ``undecided`` unless a one-sided comparison fails.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from claims.base import Figure, Finding
from claims.common import lines_figure, reported_row
from claims.model_audit import AuditRequest, plan_audit, run_audit
from numerics.reference_points import SEARCH, references_for_heads
from claims.spec import ClaimSpec, Outcome, finding
from numerics.experiments import authors

STATED_STEPS = 15_000
"""Their SGD steps in the stated (GPU) run: t = 0.01 x 15000 / 3 = 50 at d_y = 3, 150 at d_y = 1.
Sized for one H200 within 5 minutes with room to spare (docs/authors.md: the four programs' step
is memory bound, about 9 GB a step moved at the roofline, 2 ms at 4.8 TB/s; budgeted at 8 ms)."""


@dataclass(frozen=True)
class AuthorsProfile:
    """The experiment: their settings (``dx``, ``dys``, ``heads``, ``L``, ``lr``, ``batch``, the
    starts ``inits``), ``steps`` of their SGD steps, ``snapshots`` checkpoints per run (evenly
    spaced in t), ``prompts`` held-out prompts per checkpoint, ``skip`` reference points not
    computed (by default the one-head optimum: 253 CPU s at (16, 17, 17), L = 100, longer than the
    whole GPU run's training, and only reported, never compared; with one task it is the fixed
    point), ``search`` the best decomposable point's search, ``background`` theory's reference
    points computed in a second process while the runs train, ``emergence`` theory's expansion flow from each
    small-init start to its emergence end (reported beside the run).  ``cpu``: the reduced profile a CPU
    runs instead (None: run as is)."""

    dys: tuple = (3, 1)
    heads: tuple = (3, 8)
    inits: tuple = authors.AUTHORS_INITS
    dx: int = authors.AUTHORS_DX
    L: int = authors.AUTHORS_L
    lr: float = authors.AUTHORS_LR
    batch: int = authors.AUTHORS_BATCH
    steps: int = STATED_STEPS
    snapshots: int = 13
    prompts: int = 16384
    dtype: str = "float32"
    skip: tuple = ("one_head_optimum",)
    search: tuple = tuple(sorted(SEARCH.items()))
    background: bool = True
    emergence: bool = True
    cpu: Optional["AuthorsProfile"] = None


REDUCED = AuthorsProfile(steps=30, snapshots=5, prompts=4096)
"""The CPU run: 30 of the 15,000 steps (t = 0.1 at d_y = 3), 5 checkpoints (the phase readout's
least), 4096 held-out prompts (standard errors twice the stated run's).  About 4 CPU s a step for
the four programs at batch 10,000 (docs/authors.md)."""

STATED = AuthorsProfile(cpu=REDUCED)

PROFILES = {
    "tiny": AuthorsProfile(dx=6, dys=(3, 1), heads=(3,), L=16, batch=128, steps=40, snapshots=5, prompts=512,
                           skip=("one_head_optimum", "best_decomposable"), background=False, emergence=False,
                           lr=0.1),
    "quick": REDUCED,
    "paper": STATED,
    "authors": STATED,
}


def effective(p: AuthorsProfile, device: str) -> tuple[AuthorsProfile, Optional[str]]:
    """The profile that runs on ``device`` and, when it is a reduced one, the note that says so:
    what was reduced, by how much, and what it means for the comparisons."""
    run = p.cpu if (p.cpu is not None and str(device).startswith("cpu")) else p
    if run.steps >= STATED.steps:
        return run, None
    ts = ", ".join(f"t = {run.lr * run.steps / dy:.3g} (of {STATED.lr * STATED.steps / dy:.3g}) at d_y = {dy}"
                   for dy in run.dys)
    note = (f"reduced run{' on the CPU' if run is not p else ''}: {run.steps} of the stated {STATED.steps} SGD steps "
            f"({ts}), {run.snapshots} checkpoints per run (of {STATED.snapshots}), {run.prompts} held-out prompts (of "
            f"{STATED.prompts}: standard errors {math.sqrt(STATED.prompts / run.prompts):.2g}x larger). Every run is far "
            "from converged: a model on D is compared one-sidedly (not below the allocated fixed point), a model off D "
            "is not compared (undecided), convergence is not asked and claims 3-4 on the trajectories are not computed "
            "(a run cut short cannot resolve its phase ends); run the stated experiment on a GPU (bash "
            "scripts/gpu_checks.sh authors)")
    return run, note


def runs_of(p: AuthorsProfile, device: str, seed: int) -> list:
    """The runs of the profile: every (d_y, H, start), their settings, data seed ``seed`` shared by
    the starts of one shape (one prompt stream), init seed ``seed``."""
    return [authors.AuthorsRun(dy=dy, heads=H, init=init, steps=p.steps, dx=p.dx, L=p.L, lr=p.lr, batch=p.batch,
                               snapshots=p.snapshots, seed=seed, init_seed=seed, dtype=p.dtype, device=device)
            for dy in p.dys for H in p.heads for init in p.inits]


def _theory(p: AuthorsProfile, runs, seed: int, progress):
    """Theory's reference points for every (tasks, heads) of the runs: {tasks: {H: references}}
    (numerics.reference_points.references_for_heads); returns a function that waits for them.  With
    ``background`` they are computed while the runs train, in one process per independent piece
    (:func:`_pieces`: the H-independent points, the one-head optimum, the best decomposable point
    at each H), so that on a GPU machine's idle cores the longest piece, not their sum, is the
    wait (at (16, 17, 17), L = 100 the pieces take minutes of CPU each: docs/authors.md)."""
    by_tasks: dict = {}
    for r in runs:
        by_tasks.setdefault(r.tasks, set()).add(r.heads)
    args = {tasks: (tasks, sorted(hs), p.L, 0.0, seed, "cpu", dict(p.search)) for tasks, hs in by_tasks.items()}
    if not p.background:
        done = {tasks: references_for_heads(*a, skip=p.skip) for tasks, a in args.items()}
        done["emergence"] = {k: _emergence(r) for k, r in enumerate(runs) if p.emergence}
        return lambda: done
    pending = {tasks: [(piece, authors.in_background(fn, *fa, **fk)) for piece, fn, fa, fk in _pieces(a, p.skip)]
               for tasks, a in args.items()}
    flows = {k: authors.in_background(_emergence, r) for k, r in enumerate(runs)
             if p.emergence and r.init == "authors_small"}

    def wait():
        out = {}
        try:
            for tasks, jobs in pending.items():
                progress(f"theory's reference points for tasks {tasks} ({len(jobs)} background processes)", 0.85)
                out[tasks] = _assemble({piece: future.result() for piece, (future, _) in jobs})
            out["emergence"] = {k: future.result() for k, (future, _) in flows.items()}
        finally:
            for _, pool in [j for jobs in pending.values() for _, j in jobs] + list(flows.values()):
                pool.shutdown(wait=True, cancel_futures=True)
        return out
    return wait


def _pieces(args: tuple, skip: tuple) -> list:
    """The independent pieces of references_for_heads(*args, skip=skip), each (name, fn, args,
    kwargs): "shared" the H-independent points (the one-head optimum left out when it is a piece of
    its own), "one_head" (m > 1; with one task it is the fixed point, taken from it), and
    ("best", H) for each H."""
    from numerics.reference_points import REFERENCES, references

    tasks, heads, L, sigma, seed, device, search = args
    only = lambda name: tuple(set(REFERENCES) - {name}) + tuple(skip)  # noqa: E731 - every point but one
    own_one_head = len(tasks) > 1 and "one_head_optimum" not in skip
    out = [("shared", references_for_heads, args,
            {"skip": tuple(skip) + ("best_decomposable",) + (("one_head_optimum",) if own_one_head else ())})]
    if own_one_head:
        H0 = max(heads)
        out.append(("one_head", references, (tasks, H0, L, sigma, seed, device, search), {"skip": only("one_head_optimum")}))
    if "best_decomposable" not in skip:
        out += [(("best", H), references, (tasks, H, L, sigma, seed, device, search), {"skip": only("best_decomposable")})
                for H in heads]
    return out


def _assemble(parts: dict) -> dict:
    """{H: references} from the pieces of :func:`_pieces`: the shared points, with the one-head
    optimum and each H's best decomposable point put in from their own pieces."""
    out = {}
    for H, refs in parts["shared"].items():
        refs = dict(refs)
        if "one_head" in parts:
            refs["one_head_optimum"] = parts["one_head"]["one_head_optimum"]
        if ("best", H) in parts:
            refs["best_decomposable"] = parts[("best", H)]["best_decomposable"]
        out[H] = refs
    return out


def _emergence(run: "authors.AuthorsRun") -> Optional[dict]:
    """Theory's expansion flow from a small-init run's start: when its emergence ends (in our time
    and in their steps) -- reported, so a reader sees how far the run is from it; None for a start
    off D (no reduced flow starts there)."""
    if run.init != "authors_small":
        return None
    from numerics.model import initial_values
    from theory.three_phases import run_length

    om0, mu0 = initial_values(run.cfg)
    try:
        t2, status = run_length(om0, mu0, run.tasks, run.L, 0.0, "factored", run.logit_scale, lr=run.our_lr, factor=1.0)
    except (RuntimeError, ValueError) as exc:
        return {"t": None, "status": f"{type(exc).__name__}: {exc}"}
    if not math.isfinite(t2):
        return {"t": None, "status": status}
    return {"t": float(t2), "steps": int(round(t2 / run.our_lr)), "status": status}


def _prefixed(label: str, c):
    """A comparison of one run's audit, renamed with the run's label (the merged result keys by name)."""
    c.name = f"{label}: {c.name}" if not c.name.startswith(label) else c.name
    return c


def evaluate(ctx) -> Outcome:
    p, note = effective(ctx.p, ctx.device)
    runs = runs_of(p, ctx.device, ctx.seed)
    theory_refs = _theory(p, runs, ctx.seed, ctx.progress)
    trained = authors.train_runs(runs, lambda msg, f: ctx.progress(msg, 0.8 * f))
    refs = theory_refs()
    flows = refs.pop("emergence")
    comps, rows, undecided, per_run, sub_findings, panels = [], [], [], [], [], {}
    for k, res in enumerate(trained):
        run = res.run
        label = run.label
        ctx.progress(f"auditing {label} ({len(res.snapshots)} checkpoints)", 0.85 + 0.15 * k / len(trained))
        entry = {"label": label, "dy": run.dy, "tasks": list(run.tasks), "heads": run.heads, "init": run.init,
                 "their_steps": run.steps, "their_lr": run.lr, "our_lr": run.our_lr, "t_end": run.t_end,
                 "batch": run.batch, "dtype": run.dtype, "train_seconds": res.seconds,
                 "train_cpu_seconds": res.cpu_seconds, "batched_runs": res.batched_runs,
                 "emergence_prediction": flows.get(k), "records": [dataclasses.asdict(r) for r in res.records]}
        if res.error is not None:
            entry["error"] = res.error
            undecided.append(f"{label}: the run ended early ({res.error})")
            per_run.append(entry)
            continue
        request = AuditRequest(checkpoints=tuple(authors.checkpoint(res, j) for j in range(len(res.snapshots))),
                               lr=run.lr, loss_units="mean", prompts=p.prompts, seed=ctx.seed, device=ctx.device,
                               search=p.search, skip=p.skip)
        outs: list = []
        audit = run_audit(plan_audit(request), references_by_heads=refs[run.tasks], outcomes=outs,
                          cut_short=None if note is None else f"{run.steps} of the stated {STATED.steps} steps")
        for rid, kind, out in outs:
            comps.extend(_prefixed(label, c) for c in out.comparisons)
            rows.extend({**r, "name": f"{label}: {r['name']}"} for r in (out.headline or [])
                        if r.get("side") != "reported")
            if out.undecided:
                undecided.append(f"{label}, {rid}: {out.undecided}")
        for r in audit.results:
            sub_findings.extend(dataclasses.asdict(f) for f in r.findings)
        last = audit.model[-1]
        loss = last["held_out_loss"]
        rows.append(reported_row(f"{label}: held-out loss at {run.steps} steps (t = {run.t_end:.3g}; per-task mean "
                                 f"{loss['per_task_mean']['mean']:.4g}, their units)", loss["mean"], se=loss["se"],
                                 theory=last["theory"]["allocated_fixed_point"].get("loss"),
                                 config=f"tasks={tuple(run.tasks)} H={run.heads} L={run.L}"))
        entry.update({"audit": {"results": [{"id": r.id, "kind": r.kind, "verdict": r.verdict,
                                              "status": r.details.get("status"), "undecided": r.details.get("undecided")}
                                             for r in audit.results],
                                "seconds": audit.seconds, "cpu_seconds": audit.cpu_seconds, "stages": audit.stages},
                      "model": audit.model[-1], "trajectory": [{"t": m["time"], "step": m["checkpoint"]["step"],
                                                                "loss": m["held_out_loss"], "words": m["readout"]["words"],
                                                                "off_D_share": m["readout"]["off_D"]["share"]}
                                                               for m in audit.model]})
        per_run.append(entry)
        panels.setdefault((run.dy, run.heads), []).append((run, audit.model))
    figures = [_loss_figure(panels, refs)] if panels else []
    details = {"note": note, "runs": per_run, "sub_findings": sub_findings, "undecided_parts": undecided,
               "stated_steps": STATED.steps, "steps": p.steps, "device": ctx.device,
               "references": {",".join(map(str, t)): {str(H): {k: {kk: v.get(kk) for kk in ("available", "loss", "se",
                                                                                            "how", "reason", "cpu_seconds")}
                                                                 for k, v in r.items()} for H, r in by_h.items()}
                              for t, by_h in refs.items()},
               "units": "loss: this project's, E||y_q - y_hat||^2 summed over the m tasks (their MSELoss: / m); time: "
                        "t = lr x steps / m (their SGD steps at lr on a loss averaged over the m tasks)"}
    why = note or (None if comps else "no comparison was made: " + "; ".join(undecided))
    return Outcome(comps, rows, figures=figures, details=details, undecided=why)


def _loss_figure(panels: dict, refs: dict) -> Figure:
    """Held-out loss against t per (d_y, H), both starts, with theory's reference points as lines."""
    subs = []
    for (dy, H), items in sorted(panels.items(), reverse=True):
        curves = [(run.label.split(f"H={H} ", 1)[-1], [m["time"] for m in models],
                   [m["held_out_loss"]["mean"] for m in models], "points") for run, models in items]
        tasks = items[0][0].tasks
        hl = [{"y": r["loss"], "label": name} for name, r in
              (("allocated fixed point", refs[tasks][H]["allocated_fixed_point"]),
               ("best decomposable (same H)", refs[tasks][H]["best_decomposable"]),
               ("linear attention", refs[tasks][H]["linear_attention"])) if r.get("available")]
        subs.append(lines_figure(f"authors-loss-{dy}-{H}", f"d_y = {dy}, H = {H}", curves, hlines=hl,
                                 xlabel="t (ours: lr x steps / m)", ylabel="held-out loss (sum over tasks)"))
    return Figure(name="authors-loss", title="The authors' experiment trained here: held-out loss", kind="panels",
                  panels=subs, caption="checkpoints of each run (points) against theory's reference points at its "
                  "configuration (lines); the zero model's loss is sum r_i = d_x")


def findings(result) -> list:
    d = result.details
    out = []
    if d.get("note"):
        out.append(finding(result, "stops", "This run is reduced: {note}.", note=d["note"]))
    for f in d.get("sub_findings", []):
        out.append(Finding(claim=result.id, kind=f["kind"], text=f["text"], numbers=f.get("numbers", {})))
    for r in d.get("runs", []):
        e = r.get("emergence_prediction")
        if e and e.get("t"):
            out.append(finding(result, "beyond", "{label}: theory's expansion flow from this start ends its emergence at "
                               "t = {t} ({steps} of their steps at lr {lr}); this run stopped at t = {t_end} ({done} "
                               "steps).", label=r["label"], t=e["t"], steps=e["steps"], lr=r["their_lr"],
                               t_end=r["t_end"], done=r["their_steps"]))
    return out


def estimate(p: AuthorsProfile) -> float:
    """Wall seconds on 2 idle CPU cores (where the stated profile runs reduced, the reduced one):
    the main process trains (per step of a program: CPU_SAMPLE_NS per context number drawn,
    CPU_MODEL_NS per context number, head and run) and audits (AUDIT_CHECKPOINT_SECONDS a
    checkpoint at 4096 prompts, in proportion), while the background processes compute theory's
    points and flows (BACKGROUND_SECONDS per task split, on the other core); constants are CPU
    seconds measured on the reduced run (docs/authors.md)."""
    run = p.cpu if p.cpu is not None else p
    train = audit = 0.0
    for dy in run.dys:
        ctx = run.batch * run.L * (run.dx + dy)
        for H in run.heads:
            train += run.steps * ctx * 1e-9 * (CPU_SAMPLE_NS + CPU_MODEL_NS * H * len(run.inits))
            audit += len(run.inits) * run.snapshots * AUDIT_CHECKPOINT_SECONDS * run.prompts / 4096
    main = train + audit
    background = BACKGROUND_SECONDS * len(run.dys) * (run.dx * run.L / 5000) ** 0.5
    return max(main, (main + background) / 2) + STARTUP_SECONDS


CPU_SAMPLE_NS = 3.7
CPU_MODEL_NS = 0.45
"""Fitted to the reduced run's training CPU seconds (one thread, load ~7 per core): 0.34 s a step at
tasks (16, 17, 17), H = 3, 0.58 at H = 8 (two runs a program, 5.3e7 context numbers)."""
AUDIT_CHECKPOINT_SECONDS = 1.45
"""CPU seconds to measure one checkpoint at 4096 held-out prompts (readout, two evaluations)."""
BACKGROUND_SECONDS = 80.0
"""CPU seconds of theory's points (fixed point, best decomposable at each H, linear attention),
the small inits' expansion flows and the processes' start-up, per task split at d_x = 50, L = 100."""
STARTUP_SECONDS = 55.0
"""The main process's CPU seconds beside training and audit in the reduced run (imports, the
reports' JSON and figures): 165 in all, 53 training, 58 auditing."""


SPEC = ClaimSpec(
    id="authors-replica", title="The authors' released experiment, trained here and audited",
    statement="The authors' own experiment (d_x = 50 over d_y = 3 or 1 tasks, H = 3 or 8, L = 100, SGD at 0.01 on "
              "10,000 fresh prompts a step, from nn.Linear's default and from their small initialisation), trained by "
              "this project's trainer: where do its models stand against the paper's theory at that configuration?",
    profiles=PROFILES, evaluate=evaluate, kind="boundary", fields=(), estimate=estimate, findings=findings)
CLAIM_ID, TITLE, STATEMENT = SPEC.id, SPEC.title, SPEC.statement
run = SPEC.run
