"""Shared helper of the mutation suite (tests/claims/test_*_mutants.py)."""
from __future__ import annotations

import math
import sys

import numpy as np
import torch

import numerics.model
import theory.reduced_ode
from numerics.experiments import clear_cache


def patch_everywhere(monkeypatch, original, replacement) -> int:
    """Replace ``original`` by ``replacement`` in every loaded theory/numerics/claims module
    that binds it; returns how many bindings were patched."""
    n = 0
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.split(".")[0] in ("theory", "numerics", "claims"):
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                monkeypatch.setattr(mod, attr, replacement)
                n += 1
    assert n, f"{original!r} is bound nowhere: the mutant would change nothing"
    clear_cache()     # a run cached before the mutation must not answer for the mutant
    return n


def assert_caught(claim, profile, name: str) -> None:
    """The claim module's run at ``profile`` must not pass under the mutant ``name``, and some
    comparison must disagree (a mutant caught only by an undecided check is not caught)."""
    res = claim.SPEC.run(profile)
    failing = [c["name"] for c in res.details.get("comparisons", []) if not c["agrees"]]
    print(f"[mutant] {claim.SPEC.id}: {name}: verdict {res.verdict}; disagreeing: {failing}")
    assert res.verdict != "pass", res.details
    assert failing, f"{name}: verdict {res.verdict} but no comparison disagrees: {res.details.get('error')}"


def assert_control_passes(claim, profile) -> None:
    """The control: without a mutation the same profile passes, so each mutant is caught by its
    mutation, not by the profile."""
    res = claim.SPEC.run(profile)
    print(f"[mutant] {claim.SPEC.id}: control (no mutation): verdict {res.verdict}")
    assert res.verdict == "pass", res.details


def broken_projection(W, U, tasks, basis):
    """P_D that keeps W_XX and U_Y whole (only the other blocks are set to 0)."""
    d = sum(tasks)
    W = np.asarray(W, float)
    U = np.asarray(U, float)
    W, U = (W[None] if W.ndim == 2 else W), (U[None] if U.ndim == 2 else U)
    W_D, U_D = np.zeros_like(W), np.zeros_like(U)
    W_D[:, :d, :d] = W[:, :d, :d]
    U_D[:, :, d:] = U[:, :, d:]
    return W_D, U_D


def apply_mutant(monkeypatch, name: str) -> None:
    """Apply the named mutant of theory/ or numerics/ (shared by claims 1 and 2)."""
    if name == "P_D broken":
        patch_everywhere(monkeypatch, theory.reduced_ode.project_decomposable, broken_projection)
    elif name == "metric factors swapped":
        orig = theory.reduced_ode.metric_factors

        def swapped(param, omega, mu, tasks, logit_scale=1.0):
            f_om, f_mu = orig(param, omega, mu, tasks, logit_scale)
            return f_mu, f_om
        patch_everywhere(monkeypatch, orig, swapped)
    elif name == "pair kernel x1.25":
        orig = theory.reduced_ode._kernels

        def scaled():
            k = dict(orig())
            pk, dpk = k["pair_kernel"], k["d_pair_kernel"]
            k["pair_kernel"] = lambda c, r, s2: 1.25 * pk(c, r, s2)
            k["d_pair_kernel"] = lambda c, r, s2: 1.25 * dpk(c, r, s2)
            # the expansion sums the pair term through log(pair_kernel / (r + s2))
            lpr = k["log_pair_ratio"]
            k["log_pair_ratio"] = lambda c, r, s2: math.log(1.25) + lpr(c, r, s2)
            return k
        monkeypatch.setattr(theory.reduced_ode, "_kernels", scaled)
        clear_cache()
    elif name == "query attends to itself":
        orig = numerics.model.MultiHeadAttention.forward

        def forward(self, context, query):
            return orig(self, torch.cat([context, query[:, None, :]], dim=1), query)
        monkeypatch.setattr(numerics.model.MultiHeadAttention, "forward", forward)
        clear_cache()
    elif name == "logits doubled (full model)":
        patch_everywhere(monkeypatch, numerics.model.attend, logits_doubled)
    else:
        raise ValueError(name)


def logits_doubled(a, context):
    """numerics.model.attend with every logit doubled: softmax_l(2 z_l^T a_g)."""
    p = torch.softmax(2.0 * torch.bmm(a, context.transpose(1, 2)), dim=-1)
    return torch.bmm(p, context)


# ---------------------------------------------------------------------------------------
# small-factor mutants: the headline prediction moved by twice its own resolving power
# ---------------------------------------------------------------------------------------

SMALL_FACTOR = 2.0
"""How far past its resolving power the headline prediction is moved: eps is the smallest error the
comparison rejects, so 2 eps must be rejected -- by the whole claim, run end to end."""


def memoise(monkeypatch, module, *names) -> None:
    """Replace ``module.name`` (numerics' runs, which a mutant of theory does not change) by a memoised copy for
    the test: the control and the mutated runs of a small-factor mutant then share the training runs, so only
    theory and the comparisons are computed again.  The key is the repr of the arguments."""
    for name in names:
        real, memo = getattr(module, name), {}

        def wrapped(*args, _real=real, _memo=memo, **kwargs):
            key = repr((args, sorted(kwargs.items())))
            if key not in _memo:
                _memo[key] = _real(*args, **kwargs)
            return _memo[key]

        monkeypatch.setattr(module, name, wrapped)


def patch_kind(monkeypatch, name: str, run) -> None:
    """Make the engine compute the needs of kind ``name`` by ``run(**params, seed)`` for the test
    (a fake run, a mutant), and forget what it had computed."""
    import dataclasses
    from numerics import engine
    monkeypatch.setitem(engine.KINDS, name, dataclasses.replace(engine.kind_of(name), run=run))
    clear_cache()


def headline_power(result) -> dict:
    """The headline comparison's resolving power of a result (``details["resolving_power"]["headline"]``)."""
    head = (result.details.get("resolving_power") or {}).get("headline")
    assert head and head["units"], f"{result.id}: no headline comparison with a resolving power: {head}"
    return head


def small_factor_moves(head: dict) -> list:
    """(label, move) for each direction the headline sees: relative -> the factor 1 -+ SMALL_FACTOR eps,
    absolute -> the shift -+ SMALL_FACTOR eps (``move`` is what the claim's patch applies)."""
    out = []
    for key, sign in (("low", -1.0), ("high", 1.0)):
        eps = head.get(key)
        if eps is None or (head["side"] == "not above" and key == "high") or (head["side"] == "not below"
                                                                               and key == "low"):
            continue
        step = SMALL_FACTOR * eps
        if head["units"] == "relative":
            out.append((f"x (1 {'-' if sign < 0 else '+'} {step:.3g})", 1.0 + sign * step))
        else:
            out.append((f"{'-' if sign < 0 else '+'} {step:.3g}", sign * step))
    assert out, f"the headline {head['name']} sees no direction"
    return out


def assert_small_factor_caught(monkeypatch, run, patch) -> list:
    """The control ``run()`` passes; then for each move of :func:`small_factor_moves` (from the control's own
    headline resolving power) ``patch(mp, move)`` moves theory's headline prediction and ``run()`` must not pass,
    its headline comparison disagreeing.  Returns the verdicts (printed with -s)."""
    control = run()
    print(f"[small-factor] {control.id}: control verdict {control.verdict}")
    assert control.verdict == "pass", control.details.get("comparisons") or control.details
    head = headline_power(control)
    print(f"[small-factor] headline {head['name']}: resolving power {head['low']:.4g} / {head['high']:.4g} "
          f"({head['units']})")
    verdicts = []
    for label, move in small_factor_moves(head):
        with monkeypatch.context() as mp:
            patch(mp, move)
            res = run()
        comps = {c["name"]: c for c in res.details.get("comparisons", [])}
        hit = comps.get(head["name"])
        print(f"[small-factor] prediction {label}: verdict {res.verdict}; headline agrees "
              f"{hit and hit['agrees']} (error {hit and hit['error']:.4g}, tolerance {hit and hit['tolerance']:.4g})")
        assert res.verdict != "pass", (label, res.details.get("comparisons"))
        assert hit is not None and not hit["agrees"], (label, hit)
        verdicts.append((label, res.verdict))
    return verdicts


def run_at_profile(monkeypatch, table: dict, runner, profile):
    """``runner(profile="tiny")`` with the module's profile table's "tiny" entry replaced by
    ``profile`` (the boundaries' dedicated small mutant profiles)."""
    monkeypatch.setitem(table, "tiny", profile)
    return runner(profile="tiny")


def report_verdict(name: str, result) -> None:
    """Print the mutant's name, the verdict it got and the headline rows (read with ``-s``)."""
    print(f"[mutant] {name}: {result.id} -> {result.verdict}")
    for row in result.headline:
        print(f"    {row}")
