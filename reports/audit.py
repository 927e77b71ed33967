"""Audit a model trained by anyone: checkpoints in, the same kind of report out.

    python -m reports.audit CHECKPOINT [CHECKPOINT ...] --tasks R,R,.. --L L [--sigma S]
        [--basis identity|random] [--basis-seed N] [--layout auto|authors|project|factored|merged]
        [--logit-scale s] [--times T,T,.. | --steps N,N,.. --lr LR [--loss-units mean|sum]]
        [--prompts N | --max-prompts N --max-minutes M] [--seed N] [--assume-converged] [--device cpu|cuda]
        [--out DIR]

This module parses the command line, checks every argument and every file before any
computation (``claims.model_audit.plan_audit``: each checkpoint read safely and mapped by
``numerics.external``), runs the audit (``claims.model_audit.run_audit``: numerics measures,
theory predicts, the claims module compares), and renders what it returns: ``DIR/claims.json``
(the main report's top level -- ``claims``, ``findings``, ``provenance`` -- plus ``model``, one
entry per checkpoint), ``DIR/index.html`` (``reports/templates/audit.html.j2``, autoescaped) and
``DIR/figures/*.png`` (``reports.audit_figures``).  It computes nothing of its own.  The output
directory follows ``reports.build``'s policy (``reports.output``: checked before any compute,
written whole into a temporary directory, checked, then swapped in; a directory holding anything
but a previous report is refused, never deleted).  docs/audit.md has the layouts, the units and
every field of ``model``.

Exit status: 0 when no judged claim fails or errors and no boundary is contradicted or errors,
1 otherwise, 2 on bad arguments or an unreadable checkpoint (nothing computed, nothing written),
130 when interrupted (nothing written).
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as _dt
import json
import math
import platform
import shutil
import signal
import sys
import textwrap
import time
from pathlib import Path
from typing import Optional, TextIO

from audit_io.jsonable import jsonable
from claims.base import FAILING
from reports.output import check_out_dir, new_temporary, recover_leftovers, replace_with, write_tree
from reports.provenance import _version, git_state
from reports.schema import VERSIONED_PACKAGES, BadArguments, check_report
from audit_io.options import float_option, int_option, parse_int, seed_option, tasks_option, threads_option

DEFAULT_OUT = "reports/audit"
EXIT_OK, EXIT_FAILED, EXIT_BAD_ARGUMENTS, EXIT_INTERRUPTED = 0, 1, 2, 130
TEMPLATE = "audit.html.j2"
TEMPLATES = Path(__file__).resolve().parent / "templates"
MAX_PROMPTS = 2 ** 24


def _numbers(text: str, flag: str, kind) -> tuple:
    parts = [p.strip() for p in str(text).split(",")]
    if any(p == "" for p in parts):
        raise argparse.ArgumentTypeError(f"{flag} {text!r}: an empty entry (two commas, or a comma at an end)")
    out = []
    for p in parts:
        try:
            if "_" in p:
                raise ValueError
            v = parse_int(p, flag, low=0) if kind is int else float(p)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: {p!r} is not a{'n integer' if kind is int else ' number'}") from None
        if kind is float and (not math.isfinite(v) or v < 0):
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: {p!r} must be a finite number >= 0")
        out.append(v)
    return tuple(out)


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
            "Dynamics of Multi-Head Softmax Attention for In-Context Learning' (Chen, Sheen, Wang, Yang; COLT 2024): "
            "where each model sits among theory's reference points (allocated fixed point, one-head optimum, best "
            "decomposable point of the same H, linear attention), what its weights are (readout, allocation, off-D "
            "part) and, where the paper's account applies, whether it agrees. Several checkpoints of one run with "
            "training times are a trajectory: phases and winners against theory from the first (claims 3-4). Writes "
            "DIR/claims.json, DIR/index.html and DIR/figures/. Exit status: 0 every judged claim passes and no "
            "boundary is contradicted, 1 otherwise, 2 bad arguments or files, 130 interrupted.", width=92),
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
    g = p.add_argument_group("training times (several checkpoints with times are one run: a trajectory)")
    g.add_argument("--times", type=lambda s: _numbers(s, "--times", float), default=None, metavar="T,T,..",
                   help="training time of each checkpoint in this project's units (t = lr x steps, loss summed over tasks)")
    g.add_argument("--steps", type=lambda s: _numbers(s, "--steps", int), default=None, metavar="N,N,..",
                   help="the trainer's step of each checkpoint (with --lr); a file's own step entry is used without it")
    g.add_argument("--lr", type=float_option("--lr", low=0.0), default=None, metavar="LR",
                   help="the trainer's SGD step size (converts steps into times)")
    g.add_argument("--loss-units", choices=("mean", "sum"), default="mean",
                   help="how the trainer's loss treated the m tasks: mean (torch MSELoss, the authors: t = lr steps / m) "
                        "or sum (this project's: t = lr steps); default mean")
    g = p.add_argument_group("measuring")
    g.add_argument("--prompts", type=int_option("--prompts", 2, MAX_PROMPTS, "more prompts than that take hours"),
                   default=None, metavar="N", help="held-out prompts per model, as given (default: sized: a pilot of "
                   "4096 prompts says how many reject the wrong predictions, within the two caps below)")
    g.add_argument("--max-prompts", type=int_option("--max-prompts", 2, MAX_PROMPTS, "more prompts than that take hours"),
                   default=None, metavar="N", help="the most held-out prompts a sized model is measured on (default "
                   "1048576)")
    g.add_argument("--max-minutes", type=float_option("--max-minutes", low=0.0), default=None, metavar="M",
                   help="the most minutes a sized model's measurement may take at the pilot's rate (default 10); past "
                   "either cap a model that agrees is undecided, and the report says how many prompts would decide it")
    g.add_argument("--seed", type=seed_option("--seed"), default=0, metavar="N",
                   help="seed of the held-out prompts and of theory's searches (same seed: same numbers)")
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
    g = p.add_argument_group("output")
    g.add_argument("--out", default=DEFAULT_OUT, metavar="DIR",
                   help=f"report directory (default {DEFAULT_OUT}/); replaced atomically, and only if it is new, empty "
                        "or a previous report holding nothing else")
    g.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def request_from_args(args):
    """The claims layer's AuditRequest of parsed arguments (checked there)."""
    from claims.model_audit import AuditRequest

    return AuditRequest(checkpoints=tuple(args.checkpoints), tasks=args.tasks, L=args.L, sigma=args.sigma,
                        basis=args.basis, basis_seed=args.basis_seed, layout=args.layout,
                        logit_scale=args.logit_scale, times=args.times, steps=args.steps, lr=args.lr,
                        loss_units=args.loss_units, prompts=args.prompts, seed=args.seed,
                        assume_converged=args.assume_converged, device=args.device, skip=args.skip,
                        **({} if args.max_prompts is None else {"max_prompts": args.max_prompts}),
                        **({} if args.max_minutes is None else {"max_seconds": 60.0 * args.max_minutes}))


def _validate(args) -> tuple:
    """(plan, out): every check before any computation; BadArguments on anything wrong."""
    from claims.model_audit import plan_audit
    from numerics import external
    from numerics.config import check_device

    if args.prompts is not None and (args.max_prompts is not None or args.max_minutes is not None):
        raise BadArguments("--prompts N is measured as given; --max-prompts and --max-minutes cap a sized measurement: "
                           "give one or the others")
    if args.basis_seed is not None and args.basis != "random":
        raise BadArguments("--basis-seed is used only with --basis random; drop it or add --basis random")
    try:
        check_device(args.device)
    except (TypeError, ValueError) as exc:
        raise BadArguments(f"--device: {exc}") from None
    try:
        external.check_paths(args.checkpoints)      # a link loop, a FIFO, a device: refused before any read
    except ValueError as exc:
        raise BadArguments(str(exc)) from None
    out = check_out_dir(args.out, "--out", args.checkpoints)
    try:
        plan = plan_audit(request_from_args(args))
    except ValueError as exc:       # numerics.external.CheckpointError is a ValueError
        raise BadArguments(str(exc)) from None
    return plan, out


# --------------------------------------------------------------------------- rendering

class Bar:
    """The progress callback (message, fraction) as one tqdm bar on ``stream``; never raises."""

    def __init__(self, stream: TextIO, enabled: bool):
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=100, desc="audit", file=stream, dynamic_ncols=True,
                            bar_format="{desc} {percentage:3.0f}%|{bar:20}| {elapsed}{postfix}")

    def __call__(self, message: str, fraction: float) -> None:
        if self.bar is None:
            return
        try:
            self.bar.n = 100.0 * min(1.0, max(0.0, float(fraction)))
            self.bar.set_postfix_str(str(message)[:70], refresh=False)
            self.bar.refresh()
        except Exception:  # a progress display must never break the audit
            pass

    def close(self) -> None:
        if self.bar is not None:
            self.bar.n = 100.0
            self.bar.close()


def provenance(plan, audit, started: str, total: float, command: list, render_seconds: float) -> dict:
    req = plan.request
    return {
        "versions": {"python": platform.python_version(), **{p: _version(p) for p in VERSIONED_PACKAGES},
                     "safetensors": _version("safetensors")},
        "platform": platform.platform(), "device": req.device, "device_info": {"name": req.device},
        "seed": int(req.seed), "seeds": {"held_out": int(req.seed), "note": "the held-out prompts (numerics.evaluate's "
                                         "stream of this seed) and theory's searches"},
        "profile": "audit", "problem": {**plan.problem, "tasks": list(plan.problem["tasks"])},
        "request": jsonable({k: v for k, v in vars(req).items()}),
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
    from reports import audit_figures as af

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
                    "errors) among theory's reference points", lambda m=m: af.ladder_png(m), errors)
            _figure(files, figures, f"{r.id}-bars", "omega and mu by head and task", "per head, one bar per task: "
                    "an allocated model has one tall mu bar per head", lambda m=m: af.bars_png(m), errors)
            recs = m.get("records") or []
            if len(recs) >= 2:
                _figure(files, figures, f"{r.id}-records", "the file's own training records", "the loss recorded "
                        "by the trainer (one batch each) and mu against time, from the file",
                        lambda recs=recs: af.trajectory_png([x["t"] for x in recs], [x["loss"] for x in recs], None,
                                                            [x["mu"] for x in recs], title="the file's records"), errors)
        if r.id == "trajectory":
            theory = trajectory_theory(r.details)
            _figure(files, figures, "trajectory", "loss and OV values against time", "held-out loss of each checkpoint "
                    "(1 se bars), the measured phases shaded, theory's curve from the first checkpoint and its judged "
                    "phase ends (dashed, tolerance shaded) where it applies",
                    lambda d=r.details, th=theory: af.trajectory_png(d["t"], d["loss"], d["se"], d["mu"], th,
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
    """index.html from the template (autoescaped; figures inline as data URIs)."""
    import jinja2

    from reports.render import anchor      # the main page's section ids, which check_report looks for

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _fmt
    env.filters["anchor"] = anchor
    env.filters["decided"] = decided_by
    env.filters["pm"] = lambda e: "n/a" if not e else f"{_fmt(e['mean'])} ± {_fmt(e['se'], 2)}"
    inline = {k: "data:image/png;base64," + base64.b64encode(v).decode("ascii")
              for k, v in files.items() if k.endswith(".png")}
    return env.get_template(TEMPLATE).render(doc=doc, inline=inline, models={e["judged"]: e for e in doc["model"]
                                                                            if e["judged"]})


def _fmt(x, digits: int = 4) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_fmt(v, digits) for v in x) + "]"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if not math.isfinite(v):
        return str(v)
    return f"{v:.{digits}g}"


def write(out: Path, files: dict, stream: TextIO) -> Path:
    out = Path(out).absolute()
    recover_leftovers(out, stream)
    tmp = new_temporary(out)
    try:
        (tmp / "figures").mkdir()
        write_tree(tmp, files)
        problems = check_report(tmp)    # the main report's checks: strict JSON, schema, PNGs, sections
        if problems:
            raise RuntimeError("the audit report does not satisfy its schema:\n  " + "\n  ".join(problems))
        return replace_with(tmp, out, stream)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def exit_status(doc: dict) -> int:
    bad = any(e["verdict"] in FAILING.get(e["kind"], ()) or e["figure_errors"] for e in doc["claims"])
    return EXIT_FAILED if bad else EXIT_OK


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


def main(argv: Optional[list] = None, stream: Optional[TextIO] = None) -> int:
    stream = sys.stderr if stream is None else stream
    parser = make_parser()
    try:
        with contextlib.redirect_stderr(stream):    # argparse's own messages go where ours go
            args = parser.parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_BAD_ARGUMENTS
    command = [sys.executable, "-m", "reports.audit"] + list(sys.argv[1:] if argv is None else argv)
    try:
        plan, out = _validate(args)
    except BadArguments as exc:
        parser.print_usage(stream)
        print(f"{parser.prog}: error: {exc}", file=stream)
        return EXIT_BAD_ARGUMENTS
    import torch

    torch.set_num_threads(args.threads)
    print(layouts(plan.cases), file=stream, flush=True)
    started = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    from reports.build import _main_thread, _raise_interrupt   # the build's SIGTERM handling, as it is

    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if _main_thread() else None
    t0 = time.perf_counter()
    bar = Bar(stream, not args.no_progress)
    try:
        from claims.model_audit import run_audit

        audit = run_audit(plan, bar)
        bar.close()
        doc, files = render(plan, audit, started, command, t0)
        where = write(out, files, stream)
    except KeyboardInterrupt:
        bar.close()
        print(f"\ninterrupted: no report written; the previous report in {out} (if any) is intact", file=stream)
        return EXIT_INTERRUPTED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    print(summary(doc))
    print(f"report: {where / 'index.html'}")
    return exit_status(doc)


if __name__ == "__main__":
    sys.exit(main())
