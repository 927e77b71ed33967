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


def _tasks(text: str) -> tuple[int, ...]:
    try:
        tasks = tuple(int(x) for x in text.split(",") if x.strip() != "")
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


def predict(tasks, heads, L, sigma=0.0, optimality=False, seed=0, dps=30) -> dict:
    """The JSON object of ``python -m theory predict`` (see docs/theory.md for the keys)."""
    from .limiting_error import limit_multi_per_task, minimise_single, single_head_at_L
    from .optimality import linear_attention_limit, optimality_ratio
    from .reduced_ode import expansion_reliable, expansion_valid
    from .task_allocation import allocated_task_point

    m = len(tasks)
    if heads < m:
        raise ValueError(f"--heads {heads} < {m} tasks: the allocated multi-head model needs at least one "
                         f"head per task; pass --heads {m} or more")
    t0 = time.perf_counter()
    per_task = limit_multi_per_task(tasks, sigma)
    lim_multi = sum(p["limit"] for p in per_task)
    w_single, lim_single = minimise_single(tasks, sigma, dps)
    points = [allocated_task_point(r, L, sigma, dps) for r in tasks]
    omega_star = [p["omega_star"] for p in points]
    mu_star = [p["mu_star"] for p in points]
    single = single_head_at_L(tasks, L, sigma)
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
        "loss_multi_at_L": float(sum(p["loss"] for p in points)),
        "loss_single_at_L": single["loss"],
        "omega_single_at_L": single["omega"],
        "mu_single_at_L": single["mu"],
        "valid": bool(expansion_valid(omega_star) and single["valid"]),
        "reliable": bool(expansion_reliable(omega_star) and single["reliable"]),
        "fixed_point_is_local_min": all(p["local_min"] for p in points),
    }
    if optimality:
        out["optimality"] = optimality_ratio(tasks, heads, L, sigma, seed=seed)
    out["seconds"] = time.perf_counter() - t0
    return out


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
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
        out = predict(args.tasks, args.heads, args.L, args.sigma, args.optimality, args.seed, args.dps)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(out, indent=2)
    if args.out:
        _write_atomic(args.out, text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
