"""The same model written the standard way: the baseline that ``numerics.bench`` times.

A usual attention layer projects *every* token through per-head query, key and value
linear layers and mixes the heads with an output projection.  Written that way, our model
(docs/model.md, one layer, H heads, the query attends to the L context tokens only) is

    tokens  = [z_1, ..., z_L, z_q]                         (B, L+1, D),  D = d + m
    q_h     = Q_h z      k_h = K_h z      v_h = V_h z      for every token z   (per head)
    p_h,l   = softmax_l( <k_h(z_l), q_h(z_q)> / s )         l = 1..L (the query's row)
    y_hat   = O [ sum_l p_1,l v_1(z_l) ; ... ; sum_l p_H,l v_H(z_l) ]        O = [O_1 .. O_H]

which is the function of ``numerics.model.MultiHeadAttention``: <K_h z_l, Q_h z_q>/s =
z_l^T (K_h^T Q_h / s) z_q = z_l^T W_h z_q and O_h sum_l p_l V_h z_l = U_h c_h with
U_h = O_h V_h.  The work per step is O(B L D^2 H) for the projections against
O(B L D H) for ours, which projects only the single query token and the softmax-weighted
context ``c_h`` (the difference the benchmark measures).

The merged parametrisation (W_h, U_h trained directly) is the special case K_h = V_h = I
(fixed, not trained), Q_h = W_h, O_h = U_h, s = 1: the gradients with respect to the
trained layers are then exactly dL/dW_h and dL/dU_h.

Nothing here is used by the claim checks; it exists to be timed against and to be
checked equal to the real model (``tests/test_bench.py``).
"""
from __future__ import annotations

import torch
from torch import nn


class ReferenceAttention(nn.Module):
    """Multi-head softmax attention written the standard way (per-head ``nn.Linear``
    q/k/v projections applied to every token, then an output projection).

    ``cfg`` is a :class:`numerics.config.ProblemConfig` (uses ``heads``, ``token_dim``,
    ``m``, ``param``, ``logit_scale``, ``torch_dtype``, ``device``).  The weights start at
    zero; load them with :meth:`from_model` or :meth:`load_factors`.
    """

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H, D, m = cfg.heads, cfg.token_dim, cfg.m
        kw = dict(bias=False, dtype=cfg.torch_dtype, device=cfg.device)
        self.q_proj = nn.ModuleList(nn.Linear(D, D, **kw) for _ in range(H))
        self.k_proj = nn.ModuleList(nn.Linear(D, D, **kw) for _ in range(H))
        self.v_proj = nn.ModuleList(nn.Linear(D, D, **kw) for _ in range(H))
        self.o_proj = nn.Linear(H * D, m, **kw)
        self.merged = cfg.param == "merged"
        # merged: the logit scale belongs to the factored parametrisation only
        self.scale = 1.0 if self.merged else float(cfg.logit_scale)
        for p in self.parameters():
            nn.init.zeros_(p)
        if self.merged:
            # K = V = I, frozen: the model then trains W_h (= Q_h) and U_h (= O_h) directly
            eye = torch.eye(D, dtype=cfg.torch_dtype, device=cfg.device)
            for layer in (*self.k_proj, *self.v_proj):
                layer.weight.data.copy_(eye)
                layer.weight.requires_grad_(False)

    # ---- loading weights -------------------------------------------------------------
    @torch.no_grad()
    def load_factors(self, K=None, Q=None, V=None, O=None, W=None, U=None) -> "ReferenceAttention":
        """Factored: ``K, Q, V`` of shape (H, D, D) and ``O`` (H, m, D).
        Merged: ``W`` (H, D, D) and ``U`` (H, m, D)."""
        if self.merged:
            Q, O = W, U
        for h in range(self.cfg.heads):
            self.q_proj[h].weight.copy_(Q[h])
            if not self.merged:
                self.k_proj[h].weight.copy_(K[h])
                self.v_proj[h].weight.copy_(V[h])
        # the output projection sees the heads concatenated: columns h*D .. (h+1)*D are O_h
        self.o_proj.weight.copy_(torch.cat(list(O), dim=1))
        return self

    @classmethod
    def from_model(cls, model) -> "ReferenceAttention":
        """A reference holding the same weights as ``model``
        (a :class:`numerics.model.MultiHeadAttention`)."""
        ref = cls(model.cfg)
        ref.load_factors(**model_factors(model))
        return ref

    # ---- the forward pass, the standard way -------------------------------------------
    def forward(self, context: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        B, L, D = context.shape
        tokens = torch.cat([context, query[:, None, :]], dim=1)       # (B, L+1, D)
        heads = []
        for h in range(self.cfg.heads):
            q = self.q_proj[h](tokens)                                  # (B, L+1, D)
            k = self.k_proj[h](tokens)
            v = self.v_proj[h](tokens)
            # the query token's row of the attention matrix, over the L context tokens
            scores = torch.einsum("bld,bd->bl", k[:, :L], q[:, L]) / self.scale
            p = torch.softmax(scores, dim=-1)
            heads.append(torch.einsum("bl,bld->bd", p, v[:, :L]))
        return self.o_proj(torch.cat(heads, dim=-1))                   # (B, m)


def model_factors(model) -> dict:
    """The weights of a :class:`numerics.model.MultiHeadAttention` as stacked tensors:
    ``{"K", "Q", "V", "O"}`` (factored) or ``{"W", "U"}`` (merged)."""
    params = dict(model.named_parameters())
    names = ("W", "U") if model.cfg.param == "merged" else ("K", "Q", "V", "O")
    return {k: params[k].detach() for k in names}


def gd_step(module: nn.Module, prompts, lr: float, loss_fn) -> torch.Tensor:
    """One step of plain gradient descent on one batch: theta <- theta - lr * grad."""
    pred = module(prompts.context, prompts.query)
    loss = loss_fn(pred, prompts.target)
    grads = torch.autograd.grad(loss, [p for p in module.parameters() if p.requires_grad])
    with torch.no_grad():
        for p, g in zip((p for p in module.parameters() if p.requires_grad), grads):
            p.sub_(lr * g)
    return loss.detach()
