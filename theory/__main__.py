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
import os
import sys
import time

from ._validate import check_output_file


def _tasks(text: str) -> tuple[int, ...]:
    try:
        tasks = tuple(int(x) for x in text.split(","))     # an empty entry ("2,,2") is an error too
    except ValueError:
        raise argparse.ArgumentTypeError(f"--tasks must be comma-separated positive integers like 4,4,4; got {text!r}")
    if not tasks or any(r < 1 for r in tasks):
        raise argparse.ArgumentTypeError(f"--tasks must be comma-separated positive integers like 4,4,4; got {text!r}")
    return tasks


def _positive_int(name):
    def parse(text):
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {text!r}")
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be a positive integer, got {v}")
        return v
    return parse


def _positive_float(name, allow_zero=False):
    def parse(text):
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}")
        if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
            raise argparse.ArgumentTypeError(f"{name} must be {'>= 0' if allow_zero else '> 0'} and finite, got {text!r}")
        return v
    return parse


def _matrix(name):
    """One number, or rows of comma-separated numbers separated by ';' (heads x tasks)."""
    def parse(text):
        try:
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


def exact(args) -> dict:
    """The JSON object of ``python -m theory exact`` (docs/theory.md, "Exact finite-L loss")."""
    from .exact import exact_fixed_point, exact_gradient, exact_loss, finite_L_gain

    m = len(args.tasks)
    if args.benchmark:
        from .exact import benchmark

        return {"benchmark": benchmark((args.L,))}
    if args.fixed_point:
        if args.gain:
            return finite_L_gain(args.tasks, args.L, args.sigma)
        return exact_fixed_point(args.tasks, args.L, args.sigma)
    omega = _exact_matrix("--omega", args.omega, args.heads, m)
    mu = _exact_matrix("--mu", args.mu, args.heads, m)
    t0 = time.perf_counter()
    if args.gradient:
        G = exact_gradient(omega, mu, args.tasks, args.L, args.sigma)
        out = G.loss.to_dict()
        out.update({"d_omega": G.d_omega.tolist(), "d_mu": G.d_mu.tolist(),
                    "gradient_error_estimate": G.error_estimate})
    else:
        out = exact_loss(omega, mu, args.tasks, args.L, args.sigma).to_dict()
    out.update({"tasks": list(args.tasks), "heads": args.heads, "omega": omega, "mu": mu,
                "seconds": time.perf_counter() - t0})
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m theory", description=(
        "Predictions of the theory package for the multi-head softmax attention ICL model "
        "(Chen, Sheen, Wang, Yang, COLT 2024). Prints JSON."))
    sub = p.add_subparsers(dest="command", required=True)
    pr = sub.add_parser("predict", help="limits, allocated fixed point and losses at L (JSON)",
                        description=(
                            "Predict, from the large-L expansion of the reduced loss: the limits of L*loss "
                            "(allocated multi-head and best single head, summed over tasks), their ratio "
                            "(gain), the allocated fixed point (omega*, mu*) per task at this L (mpmath), and "
                            "the expansion's minimum at this L for both models."))
    pr.add_argument("--tasks", type=_tasks, required=True,
                    help="block sizes r_1,...,r_m of the m tasks, comma-separated (e.g. 4,4,4 or 2,5,9); d = sum")
    pr.add_argument("--heads", type=_positive_int("--heads"), required=True,
                    help="number of attention heads H; the allocated model needs H >= m (extra heads stay idle)")
    pr.add_argument("--L", type=_positive_float("--L"), required=True,
                    help="context length L > 0 (the expansion is in powers of 1/L)")
    pr.add_argument("--sigma", type=_positive_float("--sigma", allow_zero=True), default=0.0,
                    help="label-noise standard deviation sigma >= 0 (default 0)")
    pr.add_argument("--optimality", action="store_true",
                    help="also search the best decomposable attention over signed (omega, mu) with H heads "
                         "at this L and report the optimality ratio (slower: several L-BFGS runs)")
    pr.add_argument("--seed", type=int, default=0,
                    help="seed of the random starts of the --optimality search (default 0); same seed, same output")
    pr.add_argument("--dps", type=_positive_int("--dps"), default=30,
                    help="mpmath decimal digits for the fixed point and the limits (default 30)")
    pr.add_argument("--out", default=None,
                    help="also write the JSON to this file (written atomically: complete or absent)")
    ex = sub.add_parser("exact", help="exact finite-L loss of the decomposable model (JSON)",
                        description=(
                            "The exact loss of the decomposable (reduced) model at integer context length L "
                            "by deterministic quadrature (theory.exact): no Monte Carlo, no 1/L expansion. "
                            "Covers one head (any m) and heads that serve disjoint tasks. With --fixed-point: "
                            "the allocated fixed point at L (and with --gain the best single head and the gain)."))
    ex.add_argument("--tasks", type=_tasks, required=True,
                    help="block sizes r_1,...,r_m of the m tasks, comma-separated (e.g. 3 or 3,3)")
    ex.add_argument("--heads", type=_positive_int("--heads"), default=1,
                    help="number of heads H (default 1); --omega/--mu matrices must have H rows")
    ex.add_argument("--L", type=_positive_int("--L"), required=True,
                    help="context length L: a positive integer (the number of context tokens)")
    ex.add_argument("--omega", type=_matrix("--omega"), default=None,
                    help="QK semi-singular values: one number (every entry) or an H x m matrix written "
                         "'0.3,0.1;0.2,0.4' (rows, i.e. heads, separated by ';')")
    ex.add_argument("--mu", type=_matrix("--mu"), default=None,
                    help="OV semi-singular values, same format as --omega")
    ex.add_argument("--sigma", type=_positive_float("--sigma", allow_zero=True), default=0.0,
                    help="label-noise standard deviation sigma >= 0 (default 0)")
    ex.add_argument("--gradient", action="store_true", help="also print d loss/d omega and d loss/d mu")
    ex.add_argument("--fixed-point", action="store_true",
                    help="print the allocated fixed point at L (per task: omega*, mu*, loss) instead of a loss")
    ex.add_argument("--gain", action="store_true",
                    help="with --fixed-point: also the best single head at L and the gain single/allocated")
    ex.add_argument("--benchmark", action="store_true",
                    help="print timing lines of exact_loss (first call at a new L and warm calls) and exit")
    fo = sub.add_parser("formulas", help="print the derived formulas as the code uses them",
                        description="Print the sympy-derived formulas (expansion, F, metric factors, gain limit).")
    fo.add_argument("--json", action="store_true", help="print them as a JSON object instead of text")
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
    optimum (SPEC, large-L expansion: relative error ~ e (r + sigma^2) / L for large r). At 1
    or more the correction is as large as the leading term and the expansion says little."""
    return max(math.e * (r + sigma ** 2) / L for r in tasks)


def validity(points, single, omega_star, loss_multi, loss_single, tasks, L, sigma) -> tuple[list, list]:
    """(reasons the prediction is invalid, reasons it is unreliable); empty lists: valid,
    reliable. Invalid: the expansion diverges (some 2 omega^2 >= 1, theory.reduced_ode.
    expansion_valid), or the allocated fixed point is not a strict local minimum (it has
    collapsed onto the trivial point mu* = 0, loss = r), or a predicted loss is negative (the
    truncated expansion outside its range). Unreliable: its O(1/L^2) remainder has no finite
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
    if loss_multi < 0 or loss_single < 0:
        invalid.append(f"a predicted loss is negative (multi-head {loss_multi:.4g}, single head {loss_single:.4g}): "
                       "the truncated expansion is used far outside its range; raise L")
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
    hint = (f"the large-L expansion needs L large against e (r + sigma^2) (here "
            f"{expansion_size(tasks, L, sigma) * L:.3g} against L = {L:g}); raise --L or lower --sigma")
    _stage("limits L -> infinity (mpmath)")
    per_task = _solve(f"no L -> infinity optimum for tasks {list(tasks)} at sigma = {sigma:g}; lower --sigma",
                      limit_multi_per_task, tasks, sigma)
    lim_multi = sum(p["limit"] for p in per_task)
    w_single, lim_single = _solve(f"no single-head optimum for tasks {list(tasks)} at sigma = {sigma:g}; "
                                  "lower --sigma", minimise_single, tasks, sigma, dps)
    _stage(f"allocated fixed point at L = {L:g} ({dps} digits)")
    points = [_solve(f"no allocated fixed point for the task of block size r = {r} at L = {L:g}, sigma = "
                     f"{sigma:g}: {hint}", allocated_task_point, r, L, sigma, dps) for r in tasks]
    omega_star = [p["omega_star"] for p in points]
    mu_star = [p["mu_star"] for p in points]
    _stage("best single head at L")
    single = _solve(f"no single-head minimum at L = {L:g}, sigma = {sigma:g}: {hint}", single_head_at_L,
                    tasks, L, sigma)
    loss_multi = float(sum(p["loss"] for p in points))
    invalid, unreliable = validity(points, single, omega_star, loss_multi, single["loss"], tasks, L, sigma)
    out = {
        "tasks": list(tasks), "heads": heads, "L": L, "sigma": sigma, "d": sum(tasks), "m": m,
        "limit_multi": lim_multi,
        "limit_single": lim_single,
        "gain": lim_single / lim_multi,
        "limit_multi_per_task": [p["limit"] for p in per_task],
        "omega_limit": [p["omega_star"] for p in per_task],
        "omega_single_limit": [w ** 0.5 for w in w_single.tolist()],
        "linear_attention_limit": linear_attention_limit(tasks, sigma),
        "omega_star": omega_star,
        "mu_star": mu_star,
        "loss_multi_at_L": loss_multi,
        "loss_single_at_L": single["loss"],
        "omega_single_at_L": single["omega"],
        "mu_single_at_L": single["mu"],
        "valid": not invalid,
        "invalid_reasons": invalid,
        "reliable": not invalid and not unreliable,
        "unreliable_reasons": unreliable,
        "expansion_size": expansion_size(tasks, L, sigma),
        "fixed_point_is_local_min": all(p["local_min"] for p in points),
    }
    if optimality:
        _stage("optimality search (several L-BFGS runs)")
        out["optimality"] = optimality_ratio(tasks, heads, L, sigma, seed=seed)
    out["seconds"] = time.perf_counter() - t0
    return out


def _write_atomic(path: str, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all (temporary file + rename); creates the
    missing parent directories."""
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "formulas":
        from .formulas import all_formulas

        _stage("deriving the formulas with sympy (about 10 s on a busy 2-core machine)")

        formulas = all_formulas()
        print(json.dumps(formulas, indent=2) if args.json else "\n\n".join(f"[{k}]\n{v}" for k, v in formulas.items()))
        return 0
    if args.command == "exact":
        try:
            out = exact(args)
        except (ValueError, TypeError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except NotImplementedError as exc:
            print(f"not covered: {exc}", file=sys.stderr)
            return 3
        print(json.dumps(out, indent=2))
        return 0
    try:
        if args.out is not None:
            check_output_file("--out", args.out)
        out = predict(args.tasks, args.heads, args.L, args.sigma, args.optimality, args.seed, args.dps)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(out, indent=2)
    if args.out:
        _write_atomic(args.out, text + "\n")
    print(text)
    if not out["valid"]:
        print("warning: this prediction is not valid (\"valid\": false):\n  - " + "\n  - ".join(out["invalid_reasons"]),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
