"""Command line of the theory package: ``python -m theory predict ...`` (JSON on stdout).

Example:
    python -m theory predict --tasks 4,4,4 --heads 3 --L 1000 --sigma 0
    python -m theory predict --tasks 2,5,9 --heads 3 --L 500 --sigma 0.5 --optimality
    python -m theory formulas
    python -m theory exact --tasks 3 --heads 1 --L 64 --omega 0.3 --mu 2.0 --sigma 0
    python -m theory exact --fixed-point --tasks 3,3 --L 128
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

from numerics.io.files import check_output_path, write_output
from numerics.io.command import command_line
from numerics.io.command import float_option, int_option, seed_option, tasks_option

#: The most tasks ``theory predict`` takes: what runs in seconds.  Each task costs an mpmath fixed
#: point and the single-head optimum is a joint minimisation over all of them, which grows about
#: as m^2: measured (CPU seconds, one core, a shared machine) 5.4-6.5 s at 32 tasks (4.8 s of it the
#: start-up, sympy's derivation), 9-18 s at 64, 48 s at 128, more than 99 s at 256.  More blocks show
#: nothing a few blocks of each size do not (equal blocks share one answer).
MAX_PREDICT_TASKS = 32
#: The most heads: without --optimality the heads only name the model (its cost does not grow with
#: them); with it, :data:`MAX_OPTIMALITY_SIZE` bounds heads x tasks.
MAX_PREDICT_HEADS = 256
#: The most heads x tasks of ``predict --optimality`` (several L-BFGS runs over the H x m signed
#: (omega, mu)): measured 8.8 s CPU at 4 tasks x 8 heads, 8.9 s at 2 x 16, 25.6 s at 8 x 8 (refused).
MAX_OPTIMALITY_SIZE = 32
#: The most mpmath digits: 30 (the default) is already far beyond what any comparison uses, and
#: the cost of the root finders grows faster than linearly in the digits.
MAX_DPS = 1000


def _matrix(name):
    """One number, or rows of comma-separated numbers separated by ';' (heads x tasks)."""
    def parse(text):
        try:
            if "_" in text:
                raise ValueError(text)
            rows = [[float(x) for x in row.split(",")] for row in text.split(";")]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be one number or an H x m matrix like '0.3,0.1;0.2,0.4' (rows by ';', "
                f"entries by ','); got {text!r}")
        if any(not math.isfinite(x) for row in rows for x in row):
            raise argparse.ArgumentTypeError(f"{name} entries must be finite numbers, got {text!r}")
        if len({len(row) for row in rows}) != 1:
            raise argparse.ArgumentTypeError(f"{name}: every row must have the same number of entries (m), "
                                             f"got {text!r}")
        return rows
    return parse


def _exact_matrix(name, rows, heads, m):
    if rows is None:
        raise ValueError(f"{name} is required unless --fixed-point is given: one number or an H x m matrix")
    if len(rows) == 1 and len(rows[0]) == 1:
        return [[rows[0][0]] * m for _ in range(heads)]
    if len(rows) != heads or len(rows[0]) != m:
        raise ValueError(f"{name} has shape {len(rows)}x{len(rows[0])} but --heads {heads} and --tasks with "
                         f"m = {m} need {heads}x{m} (rows = heads separated by ';', entries = tasks by ','), "
                         "or pass one number for every entry")
    return rows


def _ignored(mode, flags, args, tail=")"):
    """Refuse the ``flags`` (given by the user) that ``mode`` ignores."""
    values = [getattr(args, f[2:].replace("-", "_")) for f in flags]
    extra = [f for f, v in zip(flags, values) if v is not None and v is not False]
    if extra:
        raise ValueError(f"{mode} and ignores {', '.join(extra)}; drop them (or {mode.split()[0]}{tail}")


def check_exact_args(args) -> None:
    """Refuse, before any quadrature, the ``exact`` options that would be ignored and the points
    whose quadrature would run for minutes or overflow (:data:`theory.exact.BETA_MAX`)."""
    from .exact import BETA_MAX, max_logit_scale

    if args.benchmark:
        return _ignored("--benchmark times exact_loss at its own points", (
            "--omega", "--mu", "--gradient", "--heads", "--sigma", "--gain", "--fixed-point"), args)
    if args.gain and not args.fixed_point:
        raise ValueError("--gain is used only with --fixed-point (the gain compares the allocated fixed point "
                         "with the best single head); add --fixed-point or drop --gain")
    if args.fixed_point:
        return _ignored("--fixed-point finds its own (omega*, mu*)", ("--omega", "--mu", "--gradient", "--heads"),
                        args, " to evaluate the loss at your point)")
    m, heads = len(args.tasks), args.heads or 1
    omega = _exact_matrix("--omega", args.omega, heads, m)
    _exact_matrix("--mu", args.mu, heads, m)
    beta = max_logit_scale(omega, args.tasks)
    if not beta <= BETA_MAX:
        raise ValueError(
            f"--omega (largest |omega| {max(abs(x) for row in omega for x in row):.4g}): the softmax logits reach a scale beta = {beta:.4g} (|omega| times the "
            f"largest |q| of the quadrature), beyond what the exact quadrature handles (beta <= {BETA_MAX:g}): its "
            "cost grows like beta^2 (minutes to hours here, an overflow at very large omega), while the softmax "
            "is then essentially a hard max over the context. Lower --omega, or estimate the loss by Monte "
            "Carlo (numerics.exact_reduced.evaluate)")


def exact(args) -> dict:
    """The JSON object of ``python -m theory exact`` (docs/theory.md, "Exact finite-L loss")."""
    from .exact import benchmark, exact_fixed_point, exact_gradient, exact_loss, finite_L_gain

    m, heads, sigma = len(args.tasks), args.heads or 1, args.sigma or 0.0
    if args.benchmark:
        return {"benchmark": benchmark((args.L,))}
    if args.fixed_point:
        return (finite_L_gain if args.gain else exact_fixed_point)(args.tasks, args.L, sigma)
    omega = _exact_matrix("--omega", args.omega, heads, m)
    mu = _exact_matrix("--mu", args.mu, heads, m)
    t0 = time.perf_counter()
    if args.gradient:
        G = exact_gradient(omega, mu, args.tasks, args.L, sigma)
        out = G.loss.to_dict()
        out.update({"d_omega": G.d_omega.tolist(), "d_mu": G.d_mu.tolist(),
                    "gradient_error_estimate": G.error_estimate})
    else:
        out = exact_loss(omega, mu, args.tasks, args.L, sigma).to_dict()
    out.update({"tasks": list(args.tasks), "heads": heads, "omega": omega, "mu": mu,
                "seconds": time.perf_counter() - t0})
    return out


def json_text(obj) -> str:
    """``obj`` as strict JSON (RFC 8259 has no NaN or Infinity): a non-finite number becomes
    null, and the key ``"non_finite"`` lists where and what it was, so that the output always
    parses and says what happened."""
    where: list = []

    def clean(x, path):
        if isinstance(x, dict):
            return {k: clean(v, f"{path}.{k}" if path else str(k)) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [clean(v, f"{path}[{n}]") for n, v in enumerate(x)]
        if hasattr(x, "tolist") and not isinstance(x, (str, bytes)):
            return clean(x.tolist(), path)
        if isinstance(x, float) and not math.isfinite(x):
            where.append(f"{path}: {x!r}")
            return None
        return x

    out = clean(obj, "")
    if where and isinstance(out, dict):
        out["non_finite"] = {"values": where, "why": "a computed value is not a finite number (written as null: "
                                                    "JSON has no NaN or Infinity)"}
    return json.dumps(out, indent=2, allow_nan=False)


_HEADS = int_option("--heads", 1, MAX_PREDICT_HEADS, "theory.__main__.MAX_PREDICT_HEADS")
_SIGMA = float_option("--sigma", low=0, allow_low=True)
_OUT = "also write the JSON to this file (written atomically: complete or absent"
# The subcommands: (help, description, options); an option is (flag, type, default, help), with
# type bool for a switch and default REQUIRED for a required option.
REQUIRED = object()
SUBCOMMANDS = {
    "predict": ("limits, allocated fixed point and losses at L (JSON)", (
        "Predict, from the large-L expansion of the reduced loss: the limits of L*loss "
        "(allocated multi-head and best single head, summed over tasks), their ratio "
        "(gain), the allocated fixed point (omega*, mu*) per task at this L (mpmath), and "
        "the expansion's minimum at this L for both models."), [
        ("--tasks", tasks_option(), REQUIRED,
         "block sizes r_1,...,r_m of the m tasks, comma-separated (e.g. 4,4,4 or 2,5,9); d = sum"),
        ("--heads", _HEADS, REQUIRED,
         "number of attention heads H; the allocated model needs H >= m (extra heads stay idle)"),
        ("--L", float_option("--L", low=0), REQUIRED, "context length L > 0 (the expansion is in powers of 1/L)"),
        ("--sigma", _SIGMA, 0.0, "label-noise standard deviation sigma >= 0 (default 0)"),
        ("--optimality", bool, False, "also search the best decomposable attention over signed (omega, mu) with H "
         "heads at this L and report the optimality ratio (slower: several L-BFGS runs)"),
        ("--seed", seed_option("--seed"), None, "with --optimality: seed of the random starts of its search, "
         "0 .. 2^64 - 1 (default 0); same seed, same output"),
        ("--dps", int_option("--dps", 1, MAX_DPS, "more digits only cost time"), 30,
         "mpmath decimal digits for the fixed point and the limits (default 30)"),
        ("--out", None, None, _OUT + ")")]),
    "exact": ("exact finite-L loss of the decomposable model (JSON)", (
        "The exact loss of the decomposable (reduced) model at integer context length L "
        "by deterministic quadrature (theory.exact): no Monte Carlo, no 1/L expansion. "
        "Covers one head (any m) and heads that serve disjoint tasks. With --fixed-point: "
        "the allocated fixed point at L (and with --gain the best single head and the gain)."), [
        ("--tasks", tasks_option(), REQUIRED,
         "block sizes r_1,...,r_m of the m tasks, comma-separated (e.g. 3 or 3,3)"),
        ("--heads", _HEADS, None, "number of heads H (default 1); --omega/--mu matrices must have H rows (not "
         "with --fixed-point or --benchmark)"),
        ("--L", int_option("--L", 1), REQUIRED,
         "context length L: a positive integer (the number of context tokens)"),
        ("--omega", _matrix("--omega"), None, "QK semi-singular values: one number (every entry) or an H x m "
         "matrix written '0.3,0.1;0.2,0.4' (rows, i.e. heads, separated by ';')"),
        ("--mu", _matrix("--mu"), None, "OV semi-singular values, same format as --omega"),
        ("--sigma", _SIGMA, None, "label-noise standard deviation sigma >= 0 (default 0; not with --benchmark)"),
        ("--gradient", bool, False, "also print d loss/d omega and d loss/d mu"),
        ("--fixed-point", bool, False,
         "print the allocated fixed point at L (per task: omega*, mu*, loss) instead of a loss"),
        ("--gain", bool, False, "with --fixed-point: also the best single head at L and the gain single/allocated"),
        ("--benchmark", bool, False,
         "print timing lines of exact_loss (first call at a new L and warm calls) and exit"),
        ("--out", None, None, _OUT + "; a device such as /dev/null is written through)")]),
    "formulas": ("print the derived formulas as the code uses them",
                 "Print the sympy-derived formulas (expansion, F, metric factors, gain limit).",
                 [("--json", bool, False, "print them as a JSON object instead of text")]),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m theory", description=(
        "Predictions of the theory package for the multi-head softmax attention ICL model "
        "(Chen, Sheen, Wang, Yang, COLT 2024). Prints JSON."),
        epilog="Exit status: 0 answered, 2 bad arguments (or no prediction at these arguments), 3 not covered "
               "by the exact quadrature, 75 the disk is full at --out (the JSON is printed on stdout first).")
    sub = p.add_subparsers(dest="command", required=True)
    for name, (short, description, options) in SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=short, description=description)
        for flag, kind, default, text in options:
            if kind is bool:
                sp.add_argument(flag, action="store_true", help=text)
            elif default is REQUIRED:
                sp.add_argument(flag, type=kind, required=True, help=text)
            else:
                sp.add_argument(flag, type=kind, default=default, help=text)
    return p


def _stage(text: str) -> None:
    """A progress line on stderr when a person watches (a terminal); silent in pipes and tests."""
    if sys.stderr.isatty():
        print(f"theory: {text}", file=sys.stderr, flush=True)


def _solve(what: str, fn, *args):
    """Run a root finder / minimiser of theory and turn its numerical failure (mpmath's
    "Could not find root", an overflow) into a message in the user's terms."""
    try:
        return fn(*args)
    except (ValueError, ZeroDivisionError, ArithmeticError) as exc:
        kind = "its root finder did not converge" if "root" in str(exc) else f"{type(exc).__name__}"
        raise PredictionFailed(f"{what} ({kind})") from None


class PredictionFailed(ValueError):
    """The large-L expansion has no usable solution at these arguments."""


def expansion_size(tasks, L, sigma) -> float:
    """max_i e (r_i + sigma^2) / L: the relative size of the 1/L correction at the allocated
    optimum (docs/model.md, large-L expansion: relative error ~ e (r + sigma^2) / L for large r). At 1
    or more the correction is as large as the leading term and the expansion says little."""
    return max(math.e * (r + sigma ** 2) / L for r in tasks)


def validity(points, single, omega_star, tasks, L, sigma) -> tuple[list, list]:
    """(reasons the prediction is invalid, reasons it is unreliable); empty lists: valid,
    reliable. Invalid: the expansion diverges (some 2 omega^2 >= 1, theory.reduced_ode.
    expansion_valid), or the allocated fixed point is not a strict local minimum (it has
    collapsed onto the trivial point mu* = 0, loss = r) (a negative loss, the truncated expansion
    outside its range, is refused by the functions that compute it). Unreliable: its O(1/L^2) remainder has no finite
    coefficient (6 omega^2 >= 1, expansion_reliable), or the 1/L correction is not small."""
    from .reduced_ode import expansion_reliable, expansion_valid

    invalid, unreliable = [], []
    if not (expansion_valid(omega_star) and single["valid"]):
        invalid.append("the expansion diverges at the predicted point (some 2 omega^2 >= 1: softmax saturation)")
    for p in {p["r"]: p for p in points}.values():      # one reason per block size
        if not p["local_min"]:
            invalid.append(f"task r = {p['r']}: the allocated fixed point is not a strict local minimum of the "
                           f"expansion (omega* = {p['omega_star']:.3g}, mu* = {p['mu_star']:.3g}: collapsed onto "
                           f"the trivial point, loss = r = {p['loss']:.6g}); L = {L:g} is too short for this block")
    if not (expansion_reliable(omega_star) and single["reliable"]):
        unreliable.append("the O(1/L^2) remainder has no finite coefficient (some 6 omega^2 >= 1); compare with "
                          "theory exact")
    size = expansion_size(tasks, L, sigma)
    if size >= 1:
        unreliable.append(f"the 1/L correction is not small: max e (r + sigma^2) / L = {size:.3g} >= 1; raise L")
    return invalid, unreliable


def predict(tasks, heads, L, sigma=0.0, optimality=False, seed=0, dps=30) -> dict:
    """The JSON object of ``python -m theory predict`` (see docs/theory.md for the keys).

    ``valid`` is False (with ``invalid_reasons``) where the prediction means nothing
    (:func:`validity`); ``reliable`` is False (with ``unreliable_reasons``) where its error is
    not small. Raises :class:`PredictionFailed` (a ValueError) with a message when the
    expansion has no fixed point at all (L too small, sigma too large)."""
    from .limiting_error import limit_multi_per_task, minimise_single, single_head_at_L
    from .optimality import linear_attention_limit, optimality_ratio
    from .task_allocation import allocated_task_point

    m = len(tasks)
    if heads < m:
        raise ValueError(f"--heads {heads} < {m} tasks: the allocated multi-head model needs at least one "
                         f"head per task; pass --heads {m} or more")
    t0 = time.perf_counter()
    at = f"at L = {L:g}, sigma = {sigma:g}: the large-L expansion needs L large against e (r + sigma^2) (here " \
         f"{expansion_size(tasks, L, sigma) * L:.3g} against L = {L:g}); raise --L or lower --sigma"
    _stage("limits L -> infinity (mpmath)")
    per_task = _solve(f"no L -> infinity optimum for tasks {list(tasks)} at sigma = {sigma:g}; lower --sigma",
                      limit_multi_per_task, tasks, sigma)
    w_single, lim_single = _solve(f"no single-head optimum for tasks {list(tasks)} at sigma = {sigma:g}; "
                                  "lower --sigma", minimise_single, tasks, sigma, dps)
    _stage(f"allocated fixed point at L = {L:g} ({dps} digits)")
    points = [_solve(f"no allocated fixed point for the task of block size r = {r} {at}", allocated_task_point,
                     r, L, sigma, dps) for r in tasks]
    omega_star = [p["omega_star"] for p in points]
    _stage("best single head at L")
    single = _solve(f"no single-head minimum {at}", single_head_at_L, tasks, L, sigma)
    invalid, unreliable = validity(points, single, omega_star, tasks, L, sigma)
    lim_multi = sum(p["limit"] for p in per_task)
    out = {"tasks": list(tasks), "heads": heads, "L": L, "sigma": sigma, "d": sum(tasks), "m": m,
           "limit_multi": lim_multi, "limit_single": lim_single, "gain": lim_single / lim_multi,
           "limit_multi_per_task": [p["limit"] for p in per_task],
           "omega_limit": [p["omega_star"] for p in per_task],
           "omega_single_limit": [w ** 0.5 for w in w_single.tolist()],
           "linear_attention_limit": linear_attention_limit(tasks, sigma),
           "omega_star": omega_star, "mu_star": [p["mu_star"] for p in points],
           "loss_multi_at_L": float(sum(p["loss"] for p in points)), "loss_single_at_L": single["loss"],
           "omega_single_at_L": single["omega"], "mu_single_at_L": single["mu"],
           "valid": not invalid, "invalid_reasons": invalid,
           "reliable": not invalid and not unreliable, "unreliable_reasons": unreliable,
           "expansion_size": expansion_size(tasks, L, sigma),
           "fixed_point_is_local_min": all(p["local_min"] for p in points)}
    if optimality:
        _stage("optimality search (several L-BFGS runs)")
        out["optimality"] = optimality_ratio(tasks, heads, L, sigma, seed=seed)
    out["seconds"] = time.perf_counter() - t0
    return out


def check_predict_args(args) -> None:
    """Refuse, before any computation, the ``predict`` options that would be ignored or that
    ask for more than it can do in reasonable time (:data:`MAX_PREDICT_TASKS`)."""
    if len(args.tasks) > MAX_PREDICT_TASKS:
        raise ValueError(f"--tasks has {len(args.tasks)} blocks, more than the limit of {MAX_PREDICT_TASKS} (each "
                         "costs an mpmath fixed point, and the single-head optimum grows as their square: 64 take "
                         "10-20 s, 256 minutes); predict a few blocks of each size (equal blocks share one answer)")
    if args.optimality and len(args.tasks) * args.heads > MAX_OPTIMALITY_SIZE:
        raise ValueError(f"--optimality at {len(args.tasks)} tasks x {args.heads} heads = "
                         f"{len(args.tasks) * args.heads}, more than the limit of {MAX_OPTIMALITY_SIZE} (its L-BFGS "
                         "search over the heads x tasks signed (omega, mu) takes 25 s at 8 x 8 and grows with "
                         "them); give fewer heads or tasks")
    if args.seed is not None and not args.optimality:
        raise ValueError("--seed seeds the random starts of the --optimality search and is ignored without it; "
                         "add --optimality or drop --seed")


# Each subcommand that answers in JSON: (refuse its bad options before any computation, compute).
# The compute functions are looked up when called (the tests replace them to show that every
# refusal comes first).
RUN = {"predict": (check_predict_args, lambda a: predict(a.tasks, a.heads, a.L, a.sigma, a.optimality,
                                                          0 if a.seed is None else a.seed, a.dps)),
       "exact": (check_exact_args, lambda a: exact(a))}


@command_line
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "formulas":
        from .formulas import all_formulas

        _stage("deriving the formulas with sympy (about 10 s on a busy 2-core machine)")
        formulas = all_formulas()
        print(json.dumps(formulas, indent=2) if args.json else "\n\n".join(f"[{k}]\n{v}" for k, v in formulas.items()))
        return 0
    check, compute = RUN[args.command]
    try:
        check(args)
        out_path = None if args.out is None else check_output_path(args.out, "--out")
        out = compute(args)
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except NotImplementedError as exc:
        print(f"not covered: {exc}", file=sys.stderr)
        return 3
    text = json_text(out)
    print(text, flush=True)      # first: a full disk at --out still leaves the answer on stdout
    if out_path is not None:
        write_output(out_path, text + "\n")
    if not out.get("valid", True):
        print("warning: this prediction is not valid (\"valid\": false):\n  - " + "\n  - ".join(out["invalid_reasons"]),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
