"""``python -m reports.theory``: theory's predictions at one configuration, as JSON on stdout.

    python -m reports.theory predict --tasks 4,4,4 --heads 3 --L 1000 --sigma 0
    python -m reports.theory predict --tasks 2,5,9 --heads 3 --L 500 --sigma 0.5 --optimality
    python -m reports.theory formulas
    python -m reports.theory exact --tasks 3 --heads 1 --L 64 --omega 0.3 --mu 2.0 --sigma 0
    python -m reports.theory exact --fixed-point --tasks 3,3 --L 128

Every number is theory's; this module only reads the options and writes the answer (through
numerics.io), so that theory/ itself stays pure mathematics with no I/O.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from numerics.io import (check_output_path, command_line, float_option, int_option, jsonable, seed_option, tasks_option,
                         write_output)

#: The most tasks of ``predict``: what runs in seconds.  Each task costs an mpmath fixed point and
#: the single-head optimum is a joint minimisation over all of them, which grows about as m^2:
#: measured (CPU seconds, one core, a shared machine) 5.4-6.5 s at 32 tasks (4.8 s of it sympy's
#: derivation at start-up), 9-18 s at 64, 48 s at 128, more than 99 s at 256.  More blocks show
#: nothing a few blocks of each size do not (equal blocks share one answer).
MAX_PREDICT_TASKS = 32
#: The most heads: without --optimality the heads only name the model (its cost does not grow with
#: them); with it, :data:`MAX_OPTIMALITY_SIZE` bounds heads x tasks.
MAX_PREDICT_HEADS = 256
#: The most heads x tasks of ``predict --optimality`` (several L-BFGS runs over the H x m signed
#: (omega, mu)): measured 8.8 s CPU at 4 tasks x 8 heads, 8.9 s at 2 x 16, 25.6 s at 8 x 8 (refused).
MAX_OPTIMALITY_SIZE = 32


def _solve(what: str, fn, *args):
    """Run a root finder / minimiser of theory and turn its numerical failure (mpmath's
    "Could not find root", an overflow) into a message in the user's terms."""
    try:
        return fn(*args)
    except (ValueError, ZeroDivisionError, ArithmeticError) as exc:
        kind = "its root finder did not converge" if "root" in str(exc) else type(exc).__name__
        raise ValueError(f"{what} ({kind})") from None


def expansion_size(tasks, L, sigma) -> float:
    """max_i e (r_i + sigma^2) / L: the relative size of the 1/L correction at the allocated
    optimum (docs/model.md, large-L expansion: relative error ~ e (r + sigma^2) / L for large r). At 1
    or more the correction is as large as the leading term and the expansion says little."""
    return max(math.e * (r + sigma ** 2) / L for r in tasks)


#: A served point whose loss is the zero model's r to within this relative margin serves nothing
#: (mu* omega* -> 0 as sigma grows: 2.7e-19 at r = 3, L = 100, sigma = 1e10).
COLLAPSED = 1e-12


def validity(points, single, omega_star, tasks, L, sigma) -> tuple[list, list]:
    """(reasons the prediction is invalid, reasons it is unreliable); empty lists: valid,
    reliable. Invalid: the expansion diverges (some 2 omega^2 >= 1, theory.reduced_ode.
    expansion_valid), or the allocated fixed point is not a strict local minimum (it has
    collapsed onto the trivial point: its loss is r, the zero model's, to within COLLAPSED r). Unreliable: its O(1/L^2) remainder has
    no finite coefficient (6 omega^2 >= 1, expansion_reliable), or the 1/L correction is not small."""
    from theory.reduced_ode import expansion_reliable, expansion_valid

    invalid, unreliable = [], []
    if not (expansion_valid(omega_star) and single["valid"]):
        invalid.append("the expansion diverges at the predicted point (some 2 omega^2 >= 1: softmax saturation)")
    for p in {p["r"]: p for p in points}.values():      # one reason per block size
        if not p["local_min"]:
            invalid.append(f"task r = {p['r']}: the allocated fixed point is not a strict local minimum of the "
                           f"expansion (omega* = {p['omega_star']:.3g}, mu* = {p['mu_star']:.3g}); L = {L:g} is "
                           f"too short for this block")
        elif p["r"] - p["loss"] <= COLLAPSED * p["r"]:
            invalid.append(f"task r = {p['r']}: the allocated fixed point collapsed onto the trivial point (mu* omega* "
                           f"= {p['mu_star'] * p['omega_star']:.3g}, loss = r = {p['loss']:.6g} to rounding): the "
                           f"noise sigma^2 = {sigma ** 2:.3g} swamps the task; lower --sigma")
    if not (expansion_reliable(omega_star) and single["reliable"]):
        unreliable.append("the O(1/L^2) remainder has no finite coefficient (some 6 omega^2 >= 1); compare with "
                          "the exact loss (python -m reports.theory exact)")
    size = expansion_size(tasks, L, sigma)
    if size >= 1:
        unreliable.append(f"the 1/L correction is not small: max e (r + sigma^2) / L = {size:.3g} >= 1; raise L")
    return invalid, unreliable


def predict(tasks, heads, L, sigma=0.0, optimality=False, seed=0) -> dict:
    """The JSON object of ``predict`` (docs/theory.md lists its keys): the L -> inf limits of
    L*loss (allocated multi-head and best single head, summed over tasks) and their ratio, the
    allocated fixed point at this L (mpmath) and the expansion's minimum at L of both models.

    ``valid`` is False (with ``invalid_reasons``) where the prediction means nothing
    (:func:`validity`); ``reliable`` is False (with ``unreliable_reasons``) where its error is
    not small. Raises ValueError saying so when the expansion has no fixed point at all (L too
    small, sigma too large)."""
    from theory.limiting_error import limit_multi_per_task, minimise_single, single_head_at_L
    from theory.optimality import linear_attention_limit, optimality_ratio
    from theory.task_allocation import allocated_task_point

    if heads < len(tasks):
        raise ValueError(f"--heads {heads} < {len(tasks)} tasks: the allocated multi-head model needs at least one "
                         f"head per task; pass --heads {len(tasks)} or more")
    at = f"at L = {L:g}, sigma = {sigma:g}: the large-L expansion needs L large against e (r + sigma^2) (here " \
         f"{expansion_size(tasks, L, sigma) * L:.3g} against L = {L:g}); raise --L or lower --sigma"
    no_limit = f"for tasks {list(tasks)} at sigma = {sigma:g}; lower --sigma"
    per_task = _solve(f"no L -> infinity optimum {no_limit}", limit_multi_per_task, tasks, sigma)
    w_single, lim_single = _solve(f"no single-head optimum {no_limit}", minimise_single, tasks, sigma)
    points = [_solve(f"no allocated fixed point for the task of block size r = {r} {at}", allocated_task_point,
                     r, L, sigma) for r in tasks]
    single = _solve(f"no single-head minimum {at}", single_head_at_L, tasks, L, sigma)
    omega_star = [p["omega_star"] for p in points]
    invalid, unreliable = validity(points, single, omega_star, tasks, L, sigma)
    lim_multi = sum(p["limit"] for p in per_task)
    out = {"tasks": list(tasks), "heads": heads, "L": L, "sigma": sigma, "d": sum(tasks), "m": len(tasks),
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
        out["optimality"] = optimality_ratio(tasks, heads, L, sigma, seed=seed)
    return out


def predict_from(args) -> dict:
    """:func:`predict` at the parsed options (looked up when called: a test that replaces
    ``predict`` sees whether any refusal came after a computation)."""
    return predict(args.tasks, args.heads, args.L, args.sigma, args.optimality, args.seed or 0)


def check_predict_args(args) -> None:
    """Refuse, before any computation, what ``predict`` would ignore or could not do in
    reasonable time (:data:`MAX_PREDICT_TASKS`, :data:`MAX_OPTIMALITY_SIZE`)."""
    m = len(args.tasks)
    if m > MAX_PREDICT_TASKS:
        raise ValueError(f"--tasks has {m} blocks, more than the limit of {MAX_PREDICT_TASKS} (each costs an "
                         "mpmath fixed point, and the single-head optimum grows as their square: 64 take 10-20 s, "
                         "256 minutes); predict a few blocks of each size (equal blocks share one answer)")
    if args.optimality and m * args.heads > MAX_OPTIMALITY_SIZE:
        raise ValueError(f"--optimality at {m} tasks x {args.heads} heads = {m * args.heads}, more than the limit "
                         f"of {MAX_OPTIMALITY_SIZE} (its L-BFGS search over the heads x tasks signed (omega, mu) "
                         "takes 25 s at 8 x 8 and grows with them); give fewer heads or tasks")
    if args.seed is not None and not args.optimality:
        raise ValueError("--seed seeds the random starts of the --optimality search and is ignored without it; "
                         "add --optimality or drop --seed")


def _matrix(name):
    """argparse type: one number, or rows of comma-separated numbers separated by ';' (heads x tasks)."""
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


def _point_matrix(name, rows, heads, m):
    """``rows`` as the heads x m matrix: one number fills every entry."""
    if rows is None:
        raise ValueError(f"{name} is required unless --fixed-point is given: one number or an H x m matrix")
    if len(rows) == 1 and len(rows[0]) == 1:
        return [[rows[0][0]] * m for _ in range(heads)]
    if len(rows) != heads or len(rows[0]) != m:
        raise ValueError(f"{name} has shape {len(rows)}x{len(rows[0])} but --heads {heads} and --tasks with "
                         f"m = {m} need {heads}x{m} (rows = heads separated by ';', entries = tasks by ','), "
                         "or pass one number for every entry")
    return rows


def check_exact_args(args) -> None:
    """Refuse, before any quadrature, the options ``exact`` would ignore and the points whose
    quadrature would run for minutes or overflow (:data:`theory.exact.BETA_MAX`)."""
    from theory.exact import BETA_MAX, max_logit_scale

    if args.fixed_point:
        extra = [flag for flag, value in (("--omega", args.omega), ("--mu", args.mu), ("--heads", args.heads))
                 if value is not None]
        if extra:
            raise ValueError(f"--fixed-point finds its own (omega*, mu*) and ignores {', '.join(extra)}; drop them "
                             "(or --fixed-point to evaluate the loss at your point)")
        return
    m, heads = len(args.tasks), args.heads or 1
    omega = _point_matrix("--omega", args.omega, heads, m)
    _point_matrix("--mu", args.mu, heads, m)
    beta = max_logit_scale(omega, args.tasks)
    if not beta <= BETA_MAX:
        raise ValueError(
            f"--omega (largest |omega| {max(abs(x) for row in omega for x in row):.4g}): the softmax logits reach "
            f"a scale beta = {beta:.4g} (|omega| times the largest |q| of the quadrature), beyond what the exact "
            f"quadrature is built for (beta <= {BETA_MAX:g}): the softmax is then essentially a hard max over the "
            "context, and its moment tables grow with beta (an overflow at very large omega). "
            "Lower --omega, or estimate the loss by Monte Carlo (numerics.exact_reduced.evaluate)")


def exact(args) -> dict:
    """The JSON object of ``exact`` (docs/theory.md, "Exact finite-L loss"): the exact loss at
    the given (omega, mu), or with --fixed-point the allocated fixed point at L, the best single
    head there and their gain (theory.exact.finite_L_gain)."""
    from theory.exact import exact_loss, finite_L_gain

    if args.fixed_point:
        return finite_L_gain(args.tasks, args.L, args.sigma)
    m, heads = len(args.tasks), args.heads or 1
    omega = _point_matrix("--omega", args.omega, heads, m)
    mu = _point_matrix("--mu", args.mu, heads, m)
    return {**exact_loss(omega, mu, args.tasks, args.L, args.sigma).to_dict(),
            "tasks": list(args.tasks), "heads": heads, "omega": omega, "mu": mu}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m reports.theory", description=(
        "Predictions of the theory package for the multi-head softmax attention ICL model "
        "(Chen, Sheen, Wang, Yang, COLT 2024). Prints JSON."),
        epilog="Exit status: 0 answered, 2 bad arguments (or no prediction at these arguments), 3 not covered "
               "by the exact quadrature, 75 the disk is full at --out (the JSON is printed on stdout first).")
    sub = p.add_subparsers(dest="command", required=True)
    heads = int_option("--heads", 1, MAX_PREDICT_HEADS, "reports.theory.MAX_PREDICT_HEADS")
    sigma = float_option("--sigma", low=0, allow_low=True)
    out = "also write the JSON to this file (written atomically: complete or absent; a device is written through)"
    pr = sub.add_parser("predict", help="limits, allocated fixed point and losses at L (JSON)", description=(
        "Predict, from the large-L expansion of the reduced loss: the limits of L*loss (allocated multi-head "
        "and best single head, summed over tasks), their ratio (gain), the allocated fixed point (omega*, mu*) "
        "per task at this L (mpmath), and the expansion's minimum at this L for both models."))
    pr.add_argument("--tasks", type=tasks_option(), required=True,
                    help="block sizes r_1,...,r_m of the m tasks, comma-separated (e.g. 4,4,4 or 2,5,9); d = sum")
    pr.add_argument("--heads", type=heads, required=True,
                    help="number of attention heads H; the allocated model needs H >= m (extra heads stay idle)")
    pr.add_argument("--L", type=float_option("--L", low=0), required=True,
                    help="context length L > 0 (the expansion is in powers of 1/L)")
    pr.add_argument("--sigma", type=sigma, default=0.0, help="label-noise standard deviation sigma >= 0 (default 0)")
    pr.add_argument("--optimality", action="store_true", help="also search the best decomposable attention over "
                    "signed (omega, mu) with H heads at this L and report the optimality ratio (several L-BFGS runs)")
    pr.add_argument("--seed", type=seed_option("--seed"), help="with --optimality: seed of the random starts of "
                    "its search, 0 .. 2^64 - 1 (default 0); same seed, same output")
    pr.add_argument("--out", help=out)
    ex = sub.add_parser("exact", help="exact finite-L loss of the decomposable model (JSON)", description=(
        "The exact loss of the decomposable (reduced) model at integer context length L by deterministic "
        "quadrature (theory.exact): no Monte Carlo, no 1/L expansion. Covers one head (any m) and heads that "
        "serve disjoint tasks. With --fixed-point: the allocated fixed point at L, the best single head and "
        "the gain."))
    ex.add_argument("--tasks", type=tasks_option(), required=True,
                    help="block sizes r_1,...,r_m of the m tasks, comma-separated (e.g. 3 or 3,3)")
    ex.add_argument("--heads", type=heads, help="number of heads H (default 1); --omega/--mu matrices must have "
                    "H rows (not with --fixed-point)")
    ex.add_argument("--L", type=int_option("--L", 1), required=True,
                    help="context length L: a positive integer (the number of context tokens)")
    ex.add_argument("--omega", type=_matrix("--omega"), help="QK semi-singular values: one number (every entry) "
                    "or an H x m matrix written '0.3,0.1;0.2,0.4' (rows, i.e. heads, separated by ';')")
    ex.add_argument("--mu", type=_matrix("--mu"), help="OV semi-singular values, same format as --omega")
    ex.add_argument("--sigma", type=sigma, default=0.0, help="label-noise standard deviation sigma >= 0 (default 0)")
    ex.add_argument("--fixed-point", action="store_true", help="print the allocated fixed point at L (per task: "
                    "omega*, mu*, loss), the best single head and the gain single/allocated instead of a loss")
    ex.add_argument("--out", help=out)
    sub.add_parser("formulas", help="print the derived formulas as the code uses them",
                   description="Print the sympy-derived formulas (expansion, F, metric factors, gain limit).")
    return p


@command_line
def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "formulas":
        from theory import all_formulas

        print("\n\n".join(f"[{k}]\n{v}" for k, v in all_formulas().items()))
        return 0
    check, compute = (check_predict_args, predict_from) if args.command == "predict" else (check_exact_args, exact)
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
    text = json.dumps(jsonable(out), indent=2, allow_nan=False)
    print(text, flush=True)      # first: a full disk at --out still leaves the answer on stdout
    if out_path is not None:
        write_output(out_path, text + "\n")
    if not out.get("valid", True):
        print("warning: this prediction is not valid (\"valid\": false):\n  - " + "\n  - ".join(out["invalid_reasons"]),
              file=sys.stderr)
    elif out.get("unreliable_reasons"):
        print("warning: this prediction is not reliable (\"reliable\": false):\n  - "
              + "\n  - ".join(out["unreliable_reasons"]), file=sys.stderr)
    return 0



if __name__ == "__main__":
    sys.exit(main())
