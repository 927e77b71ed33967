"""Prompts of the decomposable multi-task linear regression (SPEC.md, Setting).

One prompt: x_1 .. x_L, q i.i.d. N(0, I_d); task parameters g_i ~ N(0, I_{r_i}) fresh per
prompt, independent across tasks; labels y_{l,i} = g_i^T Phi_i^T x_l + eps_{l,i},
eps ~ N(0, sigma^2); target y_{q,i} = g_i^T Phi_i^T q (noiseless).  Tokens z_l = (x_l, y_l),
query token z_q = (q, 0).

Written as one matrix per prompt: y_l = B^T x_l + eps_l with B = Phi diag(g) E (d x m),
E the task indicator (E[k, i] = 1 iff basis coordinate k belongs to task i).

Everything is drawn on the target device by the caller's ``torch.Generator`` in a fixed
order ((x, eps) in one draw, q, g), so a seed fixes the stream (per device type: CPU and CUDA generators
give different streams).  The Gaussians are drawn in float32 and cast to cfg.dtype (speed;
see ``normal`` below).  The noise eps is drawn even when
sigma = 0, so runs that differ only in sigma see the same x, q, g (common random numbers).

``symmetrize=True`` applies the per-task sign-flip group {+-1}^m (y_i, g_i, eps_i -> -)
to each drawn prompt and returns all 2^m images, so that sign-flip identities (the reason
the cross blocks of the gradient vanish) hold exactly on the finite batch.
"""
from __future__ import annotations

import itertools
import numbers
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
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    gen = torch.Generator(device=check_device(device))
    gen.manual_seed(int(seed))
    return gen


def sign_flips(m: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """All 2^m sign vectors of the per-task sign-flip group, (2^m, m); row 0 is the identity."""
    return torch.tensor(list(itertools.product((1.0, -1.0), repeat=m)), dtype=dtype, device=device)


def sample_prompts(cfg: ProblemConfig, batch: int, generator: torch.Generator,
                   symmetrize: bool = False) -> Prompts:
    """Draw ``batch`` prompts of cfg's problem on cfg.device with ``generator``.

    With ``symmetrize``, batch/2^m prompts are drawn and each is returned under all 2^m
    per-task sign flips (image k of prompt p at index k * batch/2^m + p)."""
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    batch = int(batch)
    if generator.device.type != cfg.torch_device.type:
        raise ValueError(f"the generator is on {generator.device} but cfg.device is {cfg.device}; "
                         "make it with make_generator(seed, cfg.device)")
    n_flips = 2 ** cfg.m
    if symmetrize and batch % n_flips:
        raise ValueError(f"symmetrize=True returns every prompt under all 2^m = {n_flips} sign flips, so "
                         f"batch must be a multiple of {n_flips}; got {batch} (use e.g. "
                         f"{max(n_flips, batch - batch % n_flips)})")
    n = batch // n_flips if symmetrize else batch
    d, m, L, D, dt = cfg.d, cfg.m, cfg.L, cfg.token_dim, cfg.torch_dtype

    def normal(*shape):
        # Gaussians are drawn in float32 (torch's vectorised CPU sampler, ~6x faster than its
        # float64 one, which dominated a training step) and cast to cfg.dtype.  The draws are
        # N(0, 1) rounded to 24 bits (relative 6e-8), and the sampler's float32 Box-Muller
        # uniforms (resolution 2^-24) cap |z| at sqrt(2 ln 2^24) = 5.77, dropping a tail of
        # mass 8e-9: both far below any Monte-Carlo error of this project (a batch of 2048
        # prompts has relative errors ~1e-2).  All arithmetic from here on is in cfg.dtype.
        return torch.randn(*shape, generator=generator, dtype=torch.float32, device=cfg.device).to(dt)

    # One (n, L, d+m) draw holds x_l in its first d columns and eps_l in its last m, so the
    # context is built in place: y_l = B^T x_l + sigma eps_l overwrites the eps columns.
    context = normal(n, L, D)
    x, eps = context[..., :d], context[..., d:]
    query = torch.zeros(n, D, dtype=dt, device=cfg.device)
    query[:, :d] = normal(n, d)
    q = query[:, :d]
    g = normal(n, d)                        # g_i stacked: coordinates of task i in block i
    coef = g[:, :, None] * cfg.task_indicator()[None]      # diag(g) E: (n, d, m)
    if cfg.basis != "identity":
        coef = cfg.basis_matrix() @ coef                    # B = Phi diag(g) E
    y = torch.bmm(x, coef)
    if cfg.sigma > 0:
        y = y + cfg.sigma * eps
    context[..., d:] = y
    target = torch.bmm(q[:, None, :], coef)[:, 0, :]
    if symmetrize:
        # flipping task i's sign maps (g_i, eps_i) -> -(g_i, eps_i): y_i, y_{q,i} -> -y_i, -y_{q,i}
        s = sign_flips(m, dt, cfg.device)                   # (2^m, m)
        context = context.repeat(n_flips, 1, 1)
        context[..., d:] *= s.repeat_interleave(n, dim=0)[:, None, :]
        query = query.repeat(n_flips, 1)
        target = (s[:, None, :] * target[None]).reshape(batch, m)
    return Prompts(context=context, query=query, target=target)
