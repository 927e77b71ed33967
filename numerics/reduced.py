"""The exact finite-L reduced model on the semi-singular values (SPEC.md).

At the point of D with values (omega, mu) the full model predicts

    y_hat_i = sum_h mu[h,i] sum_l softmax_l( sum_j omega[h,j] <Phi_j^T x_l, Phi_j^T q> ) y_{l,i},

which is what :func:`reduced_predict` computes on a batch of prompts (no expansion in 1/L),
so L_L(omega, mu) = E ||y_q - y_hat||^2 is estimated by :func:`reduced_loss` and its
gradient by autograd.  On the same batch the full model's gradient at that point, projected
onto D, equals this gradient by the chain rule (tests/test_numerics_reduced.py).

Gradient flow of the full weights moves the values with metric factors (derivation for one
basis direction k of task i, whose W-coefficient w_k satisfies dL/dw_k = (1/r_i) dL/domega_i
by the block symmetry):
- merged: dw_k/dt = -dL/dw_k, so domega_i/dt = -(1/r_i) dL/domega_i; dmu/dt = -dL/dmu.
- factored balanced: w_k = a_k b_k / s with |a_k| = |b_k| = sqrt(s |omega_i|) (entries of K
  and Q); da/dt = -(b/s) dL/dw, db/dt = -(a/s) dL/dw, so dw/dt = -((a^2 + b^2)/s^2) dL/dw
  = -(2|omega_i|/s) dL/dw_k, i.e. domega_i/dt = -(2|omega_i|/(s r_i)) dL/domega_i.  Likewise
  mu_i = o v with |o| = |v| = sqrt|mu_i|: dmu_i/dt = -2|mu_i| dL/dmu_i.
"""
from __future__ import annotations

import torch

from .config import ProblemConfig
from .data import Prompts


def _check_values(omega: torch.Tensor, mu: torch.Tensor, cfg: ProblemConfig) -> None:
    for name, t in (("omega", omega), ("mu", mu)):
        if not torch.is_tensor(t):
            raise TypeError(f"{name} must be a torch.Tensor of shape (heads, m), got {type(t).__name__}")
        if tuple(t.shape) != (cfg.heads, cfg.m):
            raise ValueError(f"{name} must have shape (heads, m) = ({cfg.heads}, {cfg.m}), got {tuple(t.shape)}")


def reduced_predict(omega: torch.Tensor, mu: torch.Tensor, prompts: Prompts, cfg: ProblemConfig) -> torch.Tensor:
    """y_hat (B, m) of the reduced model with values omega, mu (H x m) on ``prompts``."""
    _check_values(omega, mu, cfg)
    d = cfg.d
    x, y, q = prompts.context[..., :d], prompts.context[..., d:], prompts.query[:, :d]
    if prompts.context.shape[-1] != cfg.token_dim or y.shape[-1] != cfg.m:
        raise ValueError(f"prompts have token width {prompts.context.shape[-1]}, cfg needs d+m = {cfg.token_dim}")
    if cfg.basis != "identity":
        Phi = cfg.basis_matrix()
        x, q = x @ Phi, q @ Phi                     # coordinates in the task basis: Phi^T x
    omega_coord = omega @ cfg.task_indicator().T    # (H, d): omega of the task owning coordinate k
    a = omega_coord[None, :, :] * q[:, None, :]     # (B, H, d): sum_j omega_j Phi_j Phi_j^T q in Phi coords
    logits = torch.bmm(a, x.transpose(1, 2))        # (B, H, L)
    p = torch.softmax(logits, dim=-1)
    c = torch.bmm(p, y)                             # (B, H, m): sum_l p_hl y_{l,i}
    return (mu[None] * c).sum(dim=1)


def reduced_loss(omega: torch.Tensor, mu: torch.Tensor, prompts: Prompts, cfg: ProblemConfig) -> torch.Tensor:
    """Monte-Carlo estimate of L_L(omega, mu) = E ||y_q - y_hat||^2 on ``prompts`` (scalar)."""
    pred = reduced_predict(omega, mu, prompts, cfg)
    return ((pred - prompts.target) ** 2).sum(dim=-1).mean()


def metric_factors(omega: torch.Tensor, mu: torch.Tensor, cfg: ProblemConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(f_omega, f_mu), each (H, m): d omega/dt = -f_omega dL/domega, d mu/dt = -f_mu dL/dmu.

    merged: f_omega = 1/r_i, f_mu = 1; factored balanced: f_omega = 2|omega|/(s r_i),
    f_mu = 2|mu| (s = cfg.logit_scale)."""
    _check_values(omega, mu, cfg)
    r = torch.tensor(cfg.tasks, dtype=omega.dtype, device=omega.device)[None, :]
    if cfg.param == "merged":
        return (1.0 / r).expand_as(omega).clone(), torch.ones_like(mu)
    return 2.0 * omega.abs() / (cfg.logit_scale * r), 2.0 * mu.abs()
