"""The attention read-out with a hand-written backward (an experiment against autograd).

The read-out of numerics.model.MultiHeadAttention, for one prompt (context tokens z_1..z_L
stacked as the rows of Z, L x D; query x-part q in R^d) and head h:

    a_h = W_h[:, :d] q,   s_h = Z a_h,   p_h = softmax(s_h),   c_h = Z^T p_h,
    y_hat = sum_h U_h c_h.

Backward for an upstream gradient G = dLoss/dy_hat (m):

    dU_h = sum_prompts G c_h^T,
    dc_h = U_h^T G,
    ds_h = p_h * (Z dc_h - <c_h, dc_h>)          (softmax: sum_l p_l z_l^T dc = <c, dc>)
    da_h = Z^T ds_h = Z^T (p_h * Z dc_h) - <c_h, dc_h> c_h,
    dW_h[:, :d] = sum_prompts da_h q^T.

Passes over the context: two forward (Z a, Z^T p) and two backward (Z dc, Z^T (p * Z dc)),
which is the least the algebra allows without the D x D moments Z^T diag(p) Z (D times
the work of a pass).  Autograd makes the same four passes; what the hand-written backward
saves is the softmax backward's extra (B, H, L) reduction and temporaries (the reduction
sum_l p_l dp_l is <c, dc>, a D-vector product).

First derivatives only (a second backward raises), and not for torch.func transforms (vmap,
jacrev): it is meant for the trainer's step on the full model.
"""
from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable


class AttentionReadout(torch.autograd.Function):
    """y_hat (B, m) from A = W[:, :, :d] (H, D, d), U (H, m, D), context (B, L, D) and the
    query's x part (B, d); gradients for A and U only (the prompts are data)."""

    @staticmethod
    def forward(ctx, A, U, context, query_x):
        a = torch.einsum("hij,bj->bhi", A, query_x)                   # (B, H, D)
        p = torch.softmax(torch.bmm(a, context.transpose(1, 2)), dim=-1)   # (B, H, L), stable
        c = torch.bmm(p, context)                                     # (B, H, D)
        ctx.save_for_backward(A, U, context, query_x, p, c)
        return torch.einsum("hki,bhi->bk", U, c)

    @staticmethod
    @once_differentiable          # p and c are saved as constants: no second derivatives
    def backward(ctx, grad):
        A, U, context, query_x, p, c = ctx.saved_tensors
        dU = torch.einsum("bk,bhi->hki", grad, c) if ctx.needs_input_grad[1] else None
        dA = None
        if ctx.needs_input_grad[0]:
            dc = torch.einsum("hki,bk->bhi", U, grad)                 # (B, H, D)
            w = torch.bmm(dc, context.transpose(1, 2))                # Z dc: (B, H, L)
            w.mul_(p)                                                 # p * Z dc, in place
            da = torch.bmm(w, context)                                # Z^T (p * Z dc)
            da.sub_((c * dc).sum(dim=-1, keepdim=True) * c)           # - <c, dc> c
            dA = torch.einsum("bhi,bj->hij", da, query_x)
        return dA, dU, None, None


def attention_readout(W: torch.Tensor, U: torch.Tensor, context: torch.Tensor,
                      query: torch.Tensor) -> torch.Tensor:
    """y_hat (B, m) = sum_h U_h softmax_l(z_l^T W_h z_q) z_l with the hand-written backward;
    same arguments and value as numerics.model.MultiHeadAttention.forward after its checks
    (W (H, D, D), U (H, m, D), context (B, L, D), query (B, D) with zero y part)."""
    if context.requires_grad or query.requires_grad:
        raise ValueError("attention_readout differentiates W and U only; the context and the query "
                         "must not require gradients (use the model's autograd path for that)")
    d = W.shape[1] - U.shape[1]
    return AttentionReadout.apply(W[:, :, :d], U, context, query[:, :d])
