"""``authors-replica``: the authors' released experiment, trained here, audited by theory.

Their script trains one layer of H softmax heads at d_x = 50 over d_y tasks (their DataGenerator:
blocks 16, 17, 17 for d_y = 3, one block of 50 for d_y = 1), L = 100, torch SGD at lr 0.01 on MSELoss
over 10,000 fresh prompts a step, from nn.Linear's default initialisation; beside it they define a
small initialisation.  This id trains the eight runs {d_y = 3, 1} x {H = 3, 8} x {nn.Linear's
default (init ``linear_default``), their small init (``authors_small``)} with this project's trainer
(``numerics.experiments.authors``: numerics.train.train_many, one program per shape, the two starts
of a shape on one prompt stream) for the same number of their SGD steps, keeps checkpoints evenly
spaced in time, and hands every run's checkpoints to the audit of handed models
(``claims.audit``, the machinery of ``python -m reports.audit``: the same readout, held-out
loss, theory's reference points, comparisons and findings), one trajectory per run.

A plan and a comparison (numerics.engine): the plan asks for the eight runs (kind "authors_run" of
numerics.experiments.authors: the runs of one shape from any claims train as one program, each
naming the held-out prompts its checkpoints are audited on), theory's reference points per task
split in independent pieces ("reference_points": with ``--jobs`` > 1 they run in worker processes
beside the training) and the small inits' emergence flows ("authors_emergence"); the comparison
audits every run's checkpoints through claims.audit.run_audit.

Units: their loss is ours / m (MSELoss averages over the m outputs), so S of their steps at lr are
t = lr S / m of this project's time; both are stated per run.

Kind: a boundary, decided from the plan before any run -- nn.Linear's default is off D (the
paper's "suitable initialisation" does not hold: boundary-initialisation), H = 8 > m and d_y = 1
lie outside claim 5's domain, and the small init's warm-up outlasts any run here (theory's
expansion flow from it ends its emergence at t ~ 10^3, hundreds of thousands of their steps); so
what is judged is each model's standing on the side theory puts it (claims.audit), and a
model inside the allocated account, if any, is compared two-sidedly there as in the audit.

Time.  Profile ``authors`` (= ``paper``) is the experiment at ``STATED_STEPS`` of their steps, sized
for one H200 within 5 minutes (docs/authors.md: the roofline estimate).  On a CPU it runs reduced
(as profile ``quick``): fewer steps, fewer checkpoints and held-out prompts, a note saying what was
reduced and what it means: every run is far from converged, so convergence is not asked (a plateau
would pass the descent test), a model on D is compared one-sidedly (not below the fixed point), a
model off D is not compared (undecided: the audit's "it learned something" check is asked of
trained models), the trajectories' claims 3-4 are not computed (claims.audit.run_audit's
``cut_short``), and the outcome is ``undecided`` unless a one-sided comparison fails.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

from claims.core import ClaimSpec, Figure, Finding, Outcome, finding, lines_figure, reported_row
from claims.audit import AuditRequest, plan_audit, run_audit
from numerics.engine import Need, need
from numerics.experiments import authors
from numerics.reference_points import SEARCH

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
    point), ``search`` the best decomposable point's search, ``emergence`` theory's expansion flow from each
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
    emergence: bool = True
    cpu: Optional["AuthorsProfile"] = None


REDUCED = AuthorsProfile(steps=30, snapshots=5, prompts=4096)
"""The CPU run: 30 of the 15,000 steps (t = 0.1 at d_y = 3), 5 checkpoints (the phase readout's
least), 4096 held-out prompts (standard errors twice the stated run's).  About 4 CPU s a step for
the four programs at batch 10,000 (docs/authors.md)."""

STATED = AuthorsProfile(cpu=REDUCED)

PROFILES = {
    "tiny": AuthorsProfile(dx=6, dys=(3, 1), heads=(3,), L=16, batch=128, steps=40, snapshots=5, prompts=512,
                           skip=("one_head_optimum", "best_decomposable"), emergence=False,
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


def _settings(p: AuthorsProfile, dy: int, H: int, init: str, device: str) -> dict:
    """The settings of the run (d_y, H, start) of the profile (numerics.experiments.authors.AuthorsRun's)."""
    return {"dy": dy, "heads": H, "init": init, "steps": p.steps, "dx": p.dx, "L": p.L, "lr": p.lr, "batch": p.batch,
            "snapshots": p.snapshots, "dtype": p.dtype, "device": device}


def _stream(p: AuthorsProfile, dy: int, H: int) -> tuple:
    """The name of a shape's prompt stream, shared by its two starts (one draw a step) and by the
    small init's emergence flow (the same start)."""
    return ("authors run", authors.datagenerator_blocks(p.dx, dy), H)


def run_need(ctx, p: AuthorsProfile, dy: int, H: int, init: str) -> Need:
    """One run of the experiment and the held-out prompts its checkpoints are audited on."""
    return need("authors_run", stream=_stream(p, dy, H), **_settings(p, dy, H, init, ctx.device), held_out=p.prompts)


def emergence_need(ctx, p: AuthorsProfile, dy: int, H: int) -> Need:
    """Theory's expansion flow from the small-init start of (d_y, H) (its run's init seed)."""
    return need("authors_emergence", stream=_stream(p, dy, H), **_settings(p, dy, H, "authors_small", ctx.device))


def reference_needs(p: AuthorsProfile, tasks: tuple) -> dict:
    """Theory's reference points at ``tasks`` for every H of the profile, as independent pieces
    (numerics.experiments.authors "reference_points" needs, computed side by side): "shared" the
    H-independent points (the one-head optimum left out when it is a piece of its own),
    "one_head" (m > 1, at the largest H; with one task it is the fixed point, taken from it), and
    ("best", H) the best decomposable point at each H."""
    from numerics.reference_points import REFERENCES

    heads = tuple(sorted(p.heads))
    base = {"tasks": tuple(tasks), "L": p.L, "sigma": 0.0, "search": p.search}
    skipped = lambda *names: tuple(sorted(set(p.skip) | set(names)))  # noqa: E731 - one name per point
    own_one_head = len(tasks) > 1 and "one_head_optimum" not in p.skip
    out = {"shared": need("reference_points", heads=heads, **base,
                          skip=skipped("best_decomposable", *(("one_head_optimum",) if own_one_head else ())))}
    if own_one_head:
        out["one_head"] = need("reference_points", heads=(max(heads),), skip=skipped(
            *(set(REFERENCES) - {"one_head_optimum"})), **base)
    if "best_decomposable" not in p.skip:
        out.update({("best", H): need("reference_points", heads=(H,), skip=skipped(
            *(set(REFERENCES) - {"best_decomposable"})), **base) for H in heads})
    return out


def _assemble(parts: dict) -> dict:
    """{H: references} from the pieces of :func:`reference_needs`: the shared points, with the
    one-head optimum and each H's best decomposable point put in from their own pieces."""
    out = {}
    for H, refs in parts["shared"].items():
        refs = dict(refs)
        if "one_head" in parts:
            refs["one_head_optimum"] = next(iter(parts["one_head"].values()))["one_head_optimum"]
        if ("best", H) in parts:
            refs["best_decomposable"] = parts[("best", H)][H]["best_decomposable"]
        out[H] = refs
    return out


def _runs(ctx) -> tuple:
    """(profile run, note, [(d_y, H, start)]) of the context: every (d_y, H, start) of the
    profile that runs on its device."""
    p, note = effective(ctx.p, ctx.device)
    return p, note, [(dy, H, init) for dy in p.dys for H in p.heads for init in p.inits]


def plan(ctx, results=None) -> list:
    """The eight runs (their checkpoints' audit priced with them), theory's reference points per
    task split in pieces, and the small inits' emergence flows."""
    p, _, runs = _runs(ctx)
    out = [run_need(ctx, p, dy, H, init) for dy, H, init in runs]
    for dy in p.dys:
        out += list(reference_needs(p, authors.datagenerator_blocks(p.dx, dy)).values())
    if p.emergence:
        out += [emergence_need(ctx, p, dy, H) for dy, H, init in runs if init == "authors_small"]
    return out


def _prefixed(label: str, c):
    """A comparison of one run's audit, renamed with the run's label (the merged result keys by name)."""
    c.name = f"{label}: {c.name}" if not c.name.startswith(label) else c.name
    return c


def _audit_entry(res, p: AuthorsProfile, note: Optional[str], refs: dict, ctx, into: dict) -> dict:
    """The audit of one trained run's checkpoints (claims.audit.run_audit, the run's own
    held-out prompts): its comparisons, headline rows, undecided parts and findings added to
    ``into``; returns the run's entry of the details."""
    run = res.run
    label = run.label
    request = AuditRequest(checkpoints=tuple(authors.checkpoint(res, j) for j in range(len(res.snapshots))),
                           lr=run.lr, loss_units="mean", prompts=res.held_out_prompts, seed=res.held_out_seed,
                           device=ctx.device, search=p.search, skip=p.skip)
    outs: list = []
    audit = run_audit(plan_audit(request), references_by_heads=refs[run.tasks], outcomes=outs,
                      cut_short=None if note is None else f"{run.steps} of the stated {STATED.steps} steps")
    for rid, _, out in outs:
        into["comps"].extend(_prefixed(label, c) for c in out.comparisons)
        into["rows"].extend({**r, "name": f"{label}: {r['name']}"} for r in (out.headline or [])
                            if r.get("side") != "reported")
        if out.undecided:
            into["undecided"].append(f"{label}, {rid}: {out.undecided}")
    for r in audit.results:
        into["sub_findings"].extend(dataclasses.asdict(f) for f in r.findings)
    last = audit.model[-1]
    loss = last["held_out_loss"]
    into["rows"].append(reported_row(
        f"{label}: held-out loss at {run.steps} steps (t = {run.t_end:.3g}; per-task mean "
        f"{loss['per_task_mean']['mean']:.4g}, their units)", loss["mean"], se=loss["se"],
        theory=last["theory"]["allocated_fixed_point"].get("loss"),
        config=f"tasks={tuple(run.tasks)} H={run.heads} L={run.L}"))
    return {"audit": {"results": [{"id": r.id, "kind": r.kind, "verdict": r.verdict, "status": r.details.get("status"),
                                   "undecided": r.details.get("undecided")} for r in audit.results],
                      "seconds": audit.seconds, "cpu_seconds": audit.cpu_seconds, "stages": audit.stages},
            "model": audit.model[-1], "trajectory": [{"t": m["time"], "step": m["checkpoint"]["step"],
                                                      "loss": m["held_out_loss"], "words": m["readout"]["words"],
                                                      "off_D_share": m["readout"]["off_D"]["share"]}
                                                     for m in audit.model], "models": audit.model}


def compare_results(ctx, results) -> Outcome:
    """Every run's checkpoints through the audit of handed models (claims.audit), at theory's
    reference points of its task split; the emergence flows reported beside the small inits' runs."""
    p, note, runs = _runs(ctx)
    splits = [authors.datagenerator_blocks(p.dx, dy) for dy in p.dys]
    refs = {t: _assemble({piece: results[n] for piece, n in reference_needs(p, t).items()}) for t in splits}
    into = {"comps": [], "rows": [], "undecided": [], "sub_findings": []}
    per_run, panels = [], {}
    for k, (dy, H, init) in enumerate(runs):
        res = results[run_need(ctx, p, dy, H, init)]
        run = res.run
        ctx.progress(f"auditing {run.label} ({len(res.snapshots)} checkpoints)", 0.85 + 0.15 * k / len(runs))
        flow = results[emergence_need(ctx, p, dy, H)] if p.emergence and init == "authors_small" else None
        entry = {"label": run.label, "dy": run.dy, "tasks": list(run.tasks), "heads": run.heads, "init": run.init,
                 "their_steps": run.steps, "their_lr": run.lr, "our_lr": run.our_lr, "t_end": run.t_end,
                 "batch": run.batch, "dtype": run.dtype, "train_seconds": res.seconds,
                 "train_cpu_seconds": res.cpu_seconds, "batched_runs": res.batched_runs,
                 "emergence_prediction": flow, "records": [dataclasses.asdict(r) for r in res.records]}
        if res.error is not None:
            entry["error"] = res.error
            into["undecided"].append(f"{run.label}: the run ended early ({res.error})")
        else:
            entry.update(_audit_entry(res, p, note, refs, ctx, into))
            panels.setdefault((run.dy, run.heads), []).append((run, entry.pop("models")))
        per_run.append(entry)
    figures = [_loss_figure(panels, refs)] if panels else []
    details = {"note": note, "runs": per_run, "sub_findings": into["sub_findings"],
               "undecided_parts": into["undecided"],
               "stated_steps": STATED.steps, "steps": p.steps, "device": ctx.device,
               "references": {",".join(map(str, t)): {str(H): {k: {kk: v.get(kk) for kk in ("available", "loss", "se",
                                                                                            "how", "reason", "cpu_seconds")}
                                                                 for k, v in r.items()} for H, r in by_h.items()}
                              for t, by_h in refs.items()},
               "units": "loss: this project's, E||y_q - y_hat||^2 summed over the m tasks (their MSELoss: / m); time: "
                        "t = lr x steps / m (their SGD steps at lr on a loss averaged over the m tasks)"}
    why = note or (None if into["comps"] else "no comparison was made: " + "; ".join(into["undecided"]))
    return Outcome(into["comps"], into["rows"], figures=figures, details=details, undecided=why)


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


SPEC = ClaimSpec(
    id="authors-replica", title="The authors' released experiment, trained here and audited",
    statement="The authors' own experiment (d_x = 50 over d_y = 3 or 1 tasks, H = 3 or 8, L = 100, SGD at 0.01 on "
              "10,000 fresh prompts a step, from nn.Linear's default and from their small initialisation), trained by "
              "this project's trainer: where do its models stand against the paper's theory at that configuration?",
    profiles=PROFILES, plan=plan, compare=compare_results, kind="boundary", fields=(), findings=findings)
