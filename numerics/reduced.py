"""The exact finite-L reduced model on the semi-singular values (docs/model.md).

At the point of D with values (omega, mu) the full model predicts

    y_hat_i = sum_h mu[h,i] sum_l p_hl y_{l,i},   p_h = softmax_l( sum_j omega[h,j] s_{l,j} ),

with the per-block scores s_{l,j} = <Phi_j^T x_l, Phi_j^T q> (no expansion in 1/L).  This
prediction formula has ONE definition here: :func:`attention_weights` (p from the scores)
and :func:`predict_from_scores` (y_hat from p and the labels).  :func:`reduced_predict`
computes the scores of whole prompts (:func:`block_scores`) and applies it;
``numerics.exact_reduced`` draws the scores directly (a Rao-Blackwellised estimator that
integrates the labels out analytically) and uses the same :func:`attention_weights`.

L_L(omega, mu) = E ||y_q - y_hat||^2 is estimated by :func:`reduced_loss`, its gradient by
:func:`reduced_gradient` (autograd); on the same batch the full model's gradient at that
point, projected onto D, equals it by the chain rule (tests/test_numerics_reduced.py).

Gradient flow of the full weights moves the values with the metric factors of
``theory.reduced_ode.metric_factors`` (the one definition; :func:`metric_factors` here only
converts to and from torch): merged f_omega = 1/r_i, f_mu = 1; factored balanced
f_omega = 2|omega_i|/(s r_i), f_mu = 2|mu_i|.
"""
from __future__ import annotations

import torch

from theory.reduced_ode import metric_factors as theory_metric_factors

from .config import ProblemConfig
from .data import Prompts


def _check_values(omega: torch.Tensor, mu: torch.Tensor, cfg: ProblemConfig) -> None:
    for name, t in (("omega", omega), ("mu", mu)):
        if not torch.is_tensor(t):
            raise TypeError(f"{name} must be a torch.Tensor of shape (heads, m), got {type(t).__name__}")
        if tuple(t.shape) != (cfg.heads, cfg.m):
            raise ValueError(f"{name} must have shape (heads, m) = ({cfg.heads}, {cfg.m}), got {tuple(t.shape)}")


def block_scores(prompts: Prompts, cfg: ProblemConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, labels), each (..., B, L, m): s_{l,j} = <Phi_j^T x_l, Phi_j^T q> and y_{l,j}
    (prompts of any leading shape: one batch, or the stacked streams of a numerics.batched program)."""
    d = cfg.d
    if prompts.context.shape[-1] != cfg.token_dim:
        raise ValueError(f"prompts have token width {prompts.context.shape[-1]}, cfg needs d+m = {cfg.token_dim}")
    x, y, q = prompts.context[..., :d], prompts.context[..., d:], prompts.query[..., :d]
    if cfg.basis != "identity":
        Phi = cfg.basis_matrix()
        x, q = x @ Phi, q @ Phi                     # coordinates in the task basis: Phi^T x
    scores = (x * q[..., None, :]) @ cfg.task_indicator()   # (..., B, L, m): block sums of x_lk q_k
    return scores, y


def attention_weights(omega: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """p (B, H, L): p_hl = softmax_l( sum_j omega[h,j] s_{l,j} ) for scores (B, L, m)."""
    logits = torch.matmul(omega, scores.transpose(1, 2))     # (B, H, L)
    return torch.softmax(logits, dim=-1)                     # over the context; max subtracted


def predict_from_scores(omega: torch.Tensor, mu: torch.Tensor, scores: torch.Tensor,
                        labels: torch.Tensor) -> torch.Tensor:
    """y_hat (B, m): y_hat_i = sum_h mu[h,i] sum_l p_hl y_{l,i}, p = :func:`attention_weights`."""
    c = torch.bmm(attention_weights(omega, scores), labels)  # (B, H, m): sum_l p_hl y_{l,i}
    return (mu[None] * c).sum(dim=1)


def reduced_predict(omega: torch.Tensor, mu: torch.Tensor, prompts: Prompts, cfg: ProblemConfig) -> torch.Tensor:
    """y_hat (B, m) of the reduced model with values omega, mu (H x m) on ``prompts``."""
    _check_values(omega, mu, cfg)
    return predict_from_scores(omega, mu, *block_scores(prompts, cfg))


def per_prompt_reduced_losses(omega: torch.Tensor, mu: torch.Tensor, prompts: Prompts,
                              cfg: ProblemConfig) -> torch.Tensor:
    """||y_q - y_hat||^2 of each prompt (B,) at (omega, mu)."""
    return ((reduced_predict(omega, mu, prompts, cfg) - prompts.target) ** 2).sum(dim=-1)


def reduced_loss(omega: torch.Tensor, mu: torch.Tensor, prompts: Prompts, cfg: ProblemConfig) -> torch.Tensor:
    """Monte-Carlo estimate of L_L(omega, mu) = E ||y_q - y_hat||^2 on ``prompts`` (scalar)."""
    return per_prompt_reduced_losses(omega, mu, prompts, cfg).mean()


def _leaf(t, cfg: ProblemConfig) -> torch.Tensor:
    return torch.as_tensor(t, dtype=cfg.torch_dtype, device=cfg.device).detach().clone().requires_grad_(True)


def reduced_gradient(omega, mu, prompts: Prompts, cfg: ProblemConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/domega, dL/dmu), each (H, m), of :func:`reduced_loss` on ``prompts`` (autograd)."""
    om, m_ = _leaf(omega, cfg), _leaf(mu, cfg)
    return torch.autograd.grad(reduced_loss(om, m_, prompts, cfg), [om, m_])


def per_prompt_reduced_gradients(omega, mu, prompts: Prompts, cfg: ProblemConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of each prompt's loss: (B, H, m) for omega and for mu (the Jacobian of
    :func:`per_prompt_reduced_losses`; their mean over prompts is :func:`reduced_gradient`)."""
    om, m_ = (torch.as_tensor(t, dtype=cfg.torch_dtype, device=cfg.device) for t in (omega, mu))
    return torch.autograd.functional.jacobian(lambda o, m: per_prompt_reduced_losses(o, m, prompts, cfg),
                                              (om, m_), vectorize=True)


def metric_factors(omega: torch.Tensor, mu: torch.Tensor, cfg: ProblemConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(f_omega, f_mu), each (H, m): d omega/dt = -f_omega dL/domega, d mu/dt = -f_mu dL/dmu,
    for cfg.param and cfg.logit_scale: ``theory.reduced_ode.metric_factors`` (the one
    definition) on these values, returned as tensors of omega's dtype and device.  The H x m
    values make a round trip through numpy (negligible next to a batch)."""
    _check_values(omega, mu, cfg)
    f_om, f_mu = theory_metric_factors(cfg.param, omega.detach().cpu().double().numpy(),
                                       mu.detach().cpu().double().numpy(), cfg.tasks, cfg.logit_scale)
    opts = dict(dtype=omega.dtype, device=omega.device)
    return torch.as_tensor(f_om, **opts), torch.as_tensor(f_mu, **opts)
