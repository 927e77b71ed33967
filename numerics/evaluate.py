"""Held-out loss: the population loss of trained weights, measured again on fresh prompts.

A converged loss read from the tail of the training losses is biased up while the loss
still falls (the tail averages over earlier, worse weights); the loss *at the final
weights* is

    E_prompts ||y_q - y_hat(prompts; final weights)||^2,

estimated here by the mean over ``n`` fresh i.i.d. prompts, with standard error
std(per-prompt loss) / sqrt(n) (the prompts are independent, so no autocorrelation
correction is needed).  The prompts come from a held-out stream, the one named "held out" at
``seed`` (:func:`held_out_generator`), so with the training run's own seed they are never the
prompts it trained on.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .config import ProblemConfig
from .data import make_generator, sample_prompts
from .model import MultiHeadAttention
from .reduced import per_prompt_reduced_losses
from .seeds import case_seed

def held_out_generator(seed: int, device):
    """The generator of the held-out prompts of ``seed``: the stream named "held out" at that
    seed (numerics.seeds.case_seed), never a training stream."""
    return make_generator(case_seed(seed, "held out"), device)


@dataclass(frozen=True)
class LossEstimate:
    """Mean per-prompt loss over ``n`` fresh prompts and its standard error."""
    mean: float
    se: float
    n: int


def _check(n: int, chunk: int) -> None:
    for name, v in (("n", n), ("chunk", chunk)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 2:
            raise ValueError(f"{name} must be an integer >= 2 (prompts to average), got {v!r}")


def prompt_losses(model, prompts) -> torch.Tensor:
    """The per-prompt loss ||y_q - y_hat||^2 of the full ``model`` on ``prompts``."""
    return ((model(prompts.context, prompts.query) - prompts.target) ** 2).sum(dim=-1)


def _one_problem(models) -> ProblemConfig:
    """The problem of ``models`` (full models), which must share tasks, L, sigma, basis, dtype
    and device to be evaluated on the same held-out prompts."""
    for m in models:
        if not isinstance(m, MultiHeadAttention):
            raise TypeError(f"models must be a MultiHeadAttention, got {type(m).__name__}")
    keys = [(c.tasks, c.L, c.sigma, c.basis, c.basis_seed, c.dtype, c.device) for c in (m.cfg for m in models)]
    if any(k != keys[0] for k in keys):
        raise ValueError("the models are of another problem than the first (tasks, L, sigma, basis, dtype, device): "
                         "only models of the same problem see the same held-out prompts; evaluate them apart")
    return models[0].cfg


def _held_out_many(cfg: ProblemConfig, per_prompt_fns, n: int, seed: int, chunk: int) -> list[LossEstimate]:
    """Means of each ``per_prompt(prompts)`` of ``per_prompt_fns`` over the same ``n`` fresh
    prompts of cfg's problem, drawn once, in chunks from the held-out stream of ``seed`` (a
    chunk's tensors reused for the next: the per-prompt values are new tensors), with their
    standard errors."""
    _check(n, chunk)
    gen = held_out_generator(seed, cfg.device)
    sums = [[0.0, 0.0, 0] for _ in per_prompt_fns]
    left, buf = n, None
    with torch.no_grad():
        while left > 0:
            b = min(chunk, left)
            prompts = sample_prompts(cfg, b, gen, out=buf if buf is not None and buf.batch == b else None)
            buf = prompts
            for acc, fn in zip(sums, per_prompt_fns):
                losses = fn(prompts).detach().double()
                acc[0] += float(losses.sum())
                acc[1] += float((losses ** 2).sum())
                acc[2] += losses.numel()
            left -= b
    return [_from_sums(*acc) for acc in sums]


def _from_sums(total: float, total2: float, count: int) -> LossEstimate:
    mean = total / count
    var = max(total2 / count - mean ** 2, 0.0) * count / (count - 1)
    return LossEstimate(mean=mean, se=math.sqrt(var / count), n=count)


def held_out_loss(model: MultiHeadAttention, n: int = 16384, seed: int = 0, chunk: int = 4096) -> LossEstimate:
    """Loss of the full ``model`` at its current weights on ``n`` fresh prompts of its
    problem (held-out stream of ``seed``), with its standard error."""
    return _held_out_many(_one_problem([model]), [functools.partial(prompt_losses, model)], n, seed, chunk)[0]


def held_out_losses(models, n: int = 16384, seed: int = 0, chunk: int = 4096) -> list[LossEstimate]:
    """:func:`held_out_loss` of every model of one problem (the same tasks, L, sigma, basis,
    dtype, device: the same held-out prompts), drawing each chunk of prompts once for all of
    them: each estimate equals the model's own held_out_loss exactly (e.g. the final models of
    numerics.train.train_many's runs of one seed)."""
    models = list(models)
    if not models:
        return []
    return _held_out_many(_one_problem(models), [functools.partial(prompt_losses, m) for m in models], n, seed,
                          chunk)


def held_out_reduced_loss(omega, mu, cfg: ProblemConfig, n: int = 16384, seed: int = 0,
                          chunk: int = 4096) -> LossEstimate:
    """Loss of the reduced model at (omega, mu) (H x m) on ``n`` fresh prompts of cfg's
    problem (held-out stream of ``seed``), with its standard error."""
    _check(n, chunk)
    omega = torch.as_tensor(omega, dtype=cfg.torch_dtype, device=cfg.device)
    mu = torch.as_tensor(mu, dtype=cfg.torch_dtype, device=cfg.device)
    return _held_out_many(cfg, [lambda pr: per_prompt_reduced_losses(omega, mu, pr, cfg)], n, seed, chunk)[0]


def held_out_loss_difference(model_a: MultiHeadAttention, model_b: MultiHeadAttention, n: int = 16384,
                             seed: int = 0, chunk: int = 4096) -> LossEstimate:
    """Loss of ``model_a`` minus loss of ``model_b`` on the same ``n`` fresh prompts (held-out
    stream of ``seed``), with the standard error of the paired difference: far smaller than
    the two separate standard errors combined when the models are close (the per-prompt
    losses are strongly correlated), which is what a test of "the loss still falls" needs."""
    a = _one_problem([model_a, model_b])

    def per_prompt(pr):
        return prompt_losses(model_a, pr) - prompt_losses(model_b, pr)
    return _held_out_many(a, [per_prompt], n, seed, chunk)[0]


def held_out_prompt_losses(models, n: int = 16384, seed: int = 0, chunk: int = 4096, stack_heads: int = 0):
    """Per-prompt losses (len(models), n) of several full models of one problem on the SAME
    ``n`` fresh prompts (held-out stream of ``seed``), drawn once: paired snapshots of one run,
    whose differences and slopes have far smaller standard errors than the losses themselves
    (numerics.statistics.descent_left).  ``stack_heads`` > 0: the models of one shape
    (numerics.batched.shape_key) are evaluated ``stack_heads`` heads at a time as one program
    (numerics.batched.StackedAttention.prompt_losses): the same prompts, the same losses to float
    rounding (the heads of many models summed in another order), one pass over each chunk per stack."""
    import numpy as np

    models = list(models)
    if not models:
        raise ValueError("held_out_prompt_losses needs at least one model")
    cfg = _one_problem(models)
    _check(n, chunk)
    evaluators = _stacks(models, stack_heads) if stack_heads else [
        ([k], functools.partial(prompt_losses, m)) for k, m in enumerate(models)]
    gen, out, done = held_out_generator(seed, cfg.device), np.empty((len(models), n)), 0
    with torch.no_grad():
        while done < n:
            pr = sample_prompts(cfg, min(chunk, n - done), gen)
            for idx, losses in evaluators:
                out[idx, done:done + pr.context.shape[0]] = losses(pr).double().cpu().numpy()
            done += pr.context.shape[0]
    return out


def _stacks(models: list, stack_heads: int) -> list:
    """[(indices, per-prompt losses of those models)]: the models grouped by shape, at most
    ``stack_heads`` heads (stack_heads // H models, at least one) to a stacked program."""
    from .batched import StackedAttention, shape_key

    by_shape: dict = {}
    for i, m in enumerate(models):
        by_shape.setdefault(shape_key(m.cfg), []).append(i)
    out = []
    for idx in by_shape.values():
        most = max(1, stack_heads // models[idx[0]].cfg.heads)
        out += [(idx[lo:lo + most], StackedAttention.from_models([models[i] for i in idx[lo:lo + most]]).prompt_losses)
                for lo in range(0, len(idx), most)]
    return out


def hessian_top_eigenvalue(model: MultiHeadAttention, n: int = 2048, iters: int = 16, seed: int = 0) -> float:
    """lambda_max of the population Hessian of the loss E ||y_q - y_hat||^2 in every weight of the
    full ``model`` (K, Q, V, O or W, U), by power iteration on Hessian-vector products, each on
    ``n`` fresh prompts (held-out stream of ``seed``): every product is then an unbiased estimate
    of the population Hessian's, where one batch's Hessian of n prompts, fewer than the weights
    (3 x 4 x 53^2 = 33,700 at the authors' blocks), has a top eigenvalue inflated like a sample
    covariance's (measured at the allocated point of tasks 16,17,17, H = 3, L = 100: 1727 on one
    batch of 1024 against ~1200 on fresh ones).  Returns the mean Rayleigh quotient of the last
    quarter of the ``iters`` iterations (at least 2).  Gradient descent at step eta is stable at
    the model's weights only while eta lambda_max < 2, whatever direction the eigenvector takes:
    off D too, which theory's reduced stiffness does not see (numerics.experiments.converged)."""
    _check(n, n)
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 2:
        raise ValueError(f"iters must be an integer >= 2, got {iters!r}")
    cfg = model.cfg
    gen = held_out_generator(seed, cfg.device)
    start = torch.Generator(device="cpu").manual_seed(int(seed))
    params = [p for p in model.parameters()]
    v = [torch.randn(p.shape, generator=start, dtype=torch.float64).to(p) for p in params]
    quotients = []
    for _ in range(iters):
        norm = torch.sqrt(sum((x * x).sum() for x in v))
        v = [x / norm for x in v]
        pr = sample_prompts(cfg, n, gen)
        loss = prompt_losses(model, pr).mean()
        grads = torch.autograd.grad(loss, params, create_graph=True)
        hv = torch.autograd.grad(sum((g * x).sum() for g, x in zip(grads, v)), params)
        quotients.append(float(sum((h * x).sum() for h, x in zip(hv, v))))
        v = [h.detach() for h in hv]
    tail = quotients[-max(1, len(quotients) // 4):]
    return float(sum(tail) / len(tail))
