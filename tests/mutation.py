"""Shared helper of the mutation suite (tests/test_mutants_*.py)."""
from __future__ import annotations

import sys

import numpy as np
import torch

import numerics.model
import theory.block_structure
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
    res = claim.run(profile)
    failing = [c["name"] for c in res.details.get("comparisons", []) if not c["agrees"]]
    print(f"[mutant] {claim.CLAIM_ID}: {name}: verdict {res.verdict}; disagreeing: {failing}")
    assert res.verdict != "pass", res.details
    assert failing, f"{name}: verdict {res.verdict} but no comparison disagrees: {res.details.get('error')}"


def assert_control_passes(claim, profile) -> None:
    """The control: without a mutation the same profile passes, so each mutant is caught by its
    mutation, not by the profile."""
    res = claim.run(profile)
    print(f"[mutant] {claim.CLAIM_ID}: control (no mutation): verdict {res.verdict}")
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
        patch_everywhere(monkeypatch, theory.block_structure.project_decomposable, broken_projection)
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
            return k
        monkeypatch.setattr(theory.reduced_ode, "_kernels", scaled)
        clear_cache()
    elif name in ("query attends to itself", "logits doubled (full model)"):
        orig = numerics.model.MultiHeadAttention.forward
        self_attend = name == "query attends to itself"

        def forward(self, context, query):
            if self_attend:
                return orig(self, torch.cat([context, query[:, None, :]], dim=1), query)
            W, U = self.merged_weights()
            a = torch.einsum("hij,bj->bhi", W[:, :, :self.cfg.d], query[:, :self.cfg.d])
            p = torch.softmax(2.0 * torch.bmm(a, context.transpose(1, 2)), dim=-1)
            return torch.einsum("hki,bhi->bk", U, torch.bmm(p, context))
        monkeypatch.setattr(numerics.model.MultiHeadAttention, "forward", forward)
        clear_cache()
    else:
        raise ValueError(name)
