"""Exact symmetrisation of a batch of prompts under the finite group G of
``theory.block_structure.symmetry_group`` (whose fixed set is the decomposable set D).

On a batch made of whole G-orbits the gradient of the full model at a point of D lies in D
exactly (to rounding), so gradient descent never leaves D: the claims use it to separate
the symmetry argument from Monte-Carlo noise.  (``numerics.data.sample_prompts(...,
symmetrize=True)`` applies only the per-task output sign flips, a subgroup.)
"""
from __future__ import annotations

import numpy as np
import torch

from theory.block_structure import symmetry_group

from .config import ProblemConfig
from .data import Prompts


def symmetrize_full(prompts: Prompts, cfg: ProblemConfig, drop: int = 0) -> Prompts:
    """Every prompt under every element (T, S) of G (batch x |G| prompts, element-major).

    x and q are mapped by Phi T Phi^T (exact signed permutations when Phi = I, exact to
    rounding otherwise), y_i and the target y_{q,i} by the sign S_i.  With ``drop`` > 0 the
    last ``drop`` group elements are left out: a deliberately symmetry-breaking batch."""
    T, S = symmetry_group(cfg.tasks)
    if isinstance(drop, bool) or not isinstance(drop, (int, np.integer)) or drop < 0:
        raise ValueError(f"drop must be an integer >= 0, got {drop!r}")
    if drop:
        if drop >= len(T):
            raise ValueError(f"drop must be < |G| = {len(T)}, got {drop}")
        T, S = T[:-drop], S[:-drop]
    return _apply_elements(prompts, cfg, T, S)


SUBGROUPS = ("output_signs", "x_symmetries")


def symmetrize_subgroup(prompts: Prompts, cfg: ProblemConfig, keep: str) -> Prompts:
    """Every prompt under every element of a subgroup of G (batch x |subgroup| prompts).

    ``keep="output_signs"``: the 2^m elements with T = I (per-task output sign flips only);
    their fixed set is {W_XX unrestricted, U_Y diagonal}, larger than D when d >= 2.
    ``keep="x_symmetries"``: the elements with S = +1 (coordinate sign flips and block
    shifts of x only); their fixed set is {W_XX block-scalar, U_Y unrestricted}, larger than
    D when m >= 2.  A batch symmetric under a subgroup only: the flow from D may leave D
    in the directions that subgroup does not kill (what a wrong symmetry group predicts
    it would not)."""
    if keep not in SUBGROUPS:
        raise ValueError(f"keep must be one of {SUBGROUPS}, got {keep!r}")
    T, S = symmetry_group(cfg.tasks)
    if keep == "output_signs":
        sel = np.all(T == np.eye(cfg.d)[None], axis=(1, 2))
    else:
        sel = np.all(S == 1.0, axis=1)
    return _apply_elements(prompts, cfg, T[sel], S[sel])


def _apply_elements(prompts: Prompts, cfg: ProblemConfig, T: np.ndarray, S: np.ndarray) -> Prompts:
    """The batch under the group elements (T, S) (element-major)."""
    d = cfg.d
    Phi = cfg.basis_numpy()
    A = np.einsum("ab,gbc,dc->gad", Phi, T, Phi)            # Phi T Phi^T, (G, d, d)
    A = torch.tensor(A, dtype=prompts.context.dtype, device=prompts.context.device)
    S = torch.tensor(S, dtype=prompts.context.dtype, device=prompts.context.device)
    x, y, q = prompts.context[..., :d], prompts.context[..., d:], prompts.query[:, :d]
    xg = torch.einsum("gad,bld->gbla", A, x)                  # (G, B, L, d)
    qg = torch.einsum("gad,bd->gba", A, q)
    yg = S[:, None, None, :] * y[None]
    tg = S[:, None, :] * prompts.target[None]
    G, B = A.shape[0], x.shape[0]
    context = torch.cat([xg, yg], dim=-1).reshape(G * B, cfg.L, cfg.token_dim)
    query = torch.cat([qg, torch.zeros(G, B, cfg.m, dtype=q.dtype, device=q.device)], dim=-1)
    return Prompts(context=context, query=query.reshape(G * B, cfg.token_dim),
                   target=tg.reshape(G * B, cfg.m))
