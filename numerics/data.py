"""Prompts of the decomposable multi-task linear regression (SPEC.md, Setting).

One prompt: x_1 .. x_L, q i.i.d. N(0, I_d); task parameters g_i ~ N(0, I_{r_i}) fresh per
prompt, independent across tasks; labels y_{l,i} = g_i^T Phi_i^T x_l + eps_{l,i},
eps ~ N(0, sigma^2); target y_{q,i} = g_i^T Phi_i^T q (noiseless).  Tokens z_l = (x_l, y_l),
query token z_q = (q, 0).

Written as one matrix per prompt: y_l = B^T x_l + eps_l with B = Phi diag(g) E (d x m),
E the task indicator (E[k, i] = 1 iff basis coordinate k belongs to task i).

Everything is drawn on the target device by the caller's ``torch.Generator`` in a fixed
order (x, q, g, eps), so a seed fixes the stream.  The noise eps is drawn even when
sigma = 0, so runs that differ only in sigma see the same x, q, g (common random numbers).

``symmetrize=True`` applies the per-task sign-flip group {+-1}^m (y_i, g_i, eps_i -> -)
to each drawn prompt and returns all 2^m images, so that sign-flip identities (the reason
the cross blocks of the gradient vanish) hold exactly on the finite batch.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from .config import ProblemConfig, check_device


@dataclass
class Prompts:
    context: torch.Tensor   # (B, L, d+m): tokens z_l = (x_l, y_l)
    query: torch.Tensor     # (B, d+m):    z_q = (q, 0)
    target: torch.Tensor    # (B, m):      y_q (noiseless)

    @property
    def batch(self) -> int:
        return self.context.shape[0]


def make_generator(seed: int, device) -> torch.Generator:
    """A torch.Generator on ``device`` seeded with ``seed`` (prompts are drawn on-device)."""
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    gen = torch.Generator(device=check_device(device))
    gen.manual_seed(seed)
    return gen


def sign_flips(m: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """All 2^m sign vectors of the per-task sign-flip group, (2^m, m); row 0 is the identity."""
    return torch.tensor(list(itertools.product((1.0, -1.0), repeat=m)), dtype=dtype, device=device)


def sample_prompts(cfg: ProblemConfig, batch: int, generator: torch.Generator,
                   symmetrize: bool = False) -> Prompts:
    """Draw ``batch`` prompts of cfg's problem on cfg.device with ``generator``.

    With ``symmetrize``, batch/2^m prompts are drawn and each is returned under all 2^m
    per-task sign flips (image k of prompt p at index k * batch/2^m + p)."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    if generator.device.type != cfg.torch_device.type:
        raise ValueError(f"the generator is on {generator.device} but cfg.device is {cfg.device}; "
                         "make it with make_generator(seed, cfg.device)")
    n_flips = 2 ** cfg.m
    if symmetrize and batch % n_flips:
        raise ValueError(f"symmetrize=True returns every prompt under all 2^m = {n_flips} sign flips, so "
                         f"batch must be a multiple of {n_flips}; got {batch} (use e.g. "
                         f"{max(n_flips, batch - batch % n_flips)})")
    n = batch // n_flips if symmetrize else batch
    d, m, L = cfg.d, cfg.m, cfg.L
    opts = dict(generator=generator, dtype=cfg.torch_dtype, device=cfg.device)
    x = torch.randn(n, L, d, **opts)
    q = torch.randn(n, d, **opts)
    g = torch.randn(n, d, **opts)           # g_i stacked: coordinates of task i in block i
    eps = torch.randn(n, L, m, **opts)
    coef = g[:, :, None] * cfg.task_indicator()[None]      # diag(g) E: (n, d, m)
    if cfg.basis != "identity":
        coef = cfg.basis_matrix() @ coef                    # B = Phi diag(g) E
    y = torch.bmm(x, coef)
    if cfg.sigma > 0:
        y = y + cfg.sigma * eps
    target = torch.bmm(q[:, None, :], coef)[:, 0, :]
    if symmetrize:
        # flipping task i's sign maps (g_i, eps_i) -> -(g_i, eps_i): y_i, y_{q,i} -> -y_i, -y_{q,i}
        s = sign_flips(m, cfg.torch_dtype, cfg.device)     # (2^m, m)
        x = x.repeat(n_flips, 1, 1)
        q = q.repeat(n_flips, 1)
        y = (s[:, None, None, :] * y[None]).reshape(batch, L, m)
        target = (s[:, None, :] * target[None]).reshape(batch, m)
    context = torch.cat([x, y], dim=-1)
    query = torch.cat([q, torch.zeros(q.shape[0], m, dtype=q.dtype, device=q.device)], dim=-1)
    return Prompts(context=context, query=query, target=target)
