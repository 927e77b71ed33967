"""What a trained model is: its held-out loss on fresh prompts, and the allocation readout of its
(omega, mu).

Held-out loss: the population loss of trained weights, measured again on fresh prompts.

A converged loss read from the tail of the training losses is biased up while the loss
still falls (the tail averages over earlier, worse weights); the loss *at the final
weights* is

    E_prompts ||y_q - y_hat(prompts; final weights)||^2,

estimated here by the mean over ``n`` fresh i.i.d. prompts, with standard error
std(per-prompt loss) / sqrt(n) (the prompts are independent, so no autocorrelation
correction is needed).  The prompts come from a held-out stream, the one named "held out" at
``seed`` (:func:`held_out_generator`), so with the training run's own seed they are never the
prompts it trained on.

The one readout of allocation: which head serves each task in a trained model's (omega, mu),
how much the other heads still carry, and what that makes the model.

Two rules name a task's head, and each is argued once here:

- the **serving head** (largest |mu[h, i]|): the head whose OV value carries task i's output;
  used to say whether a trained model is *allocated* (every off-task |mu| small against the
  serving one, distinct tasks on distinct heads) or a *superposition* (an off-task mu of the
  opposite sign, a head cancelling the softmax's constant part, docs/model.md);
- the **winning head** (largest mu[h, i] omega[h, i], signed): theory's ODE rule reads the
  race in the same product (the warm-up growth rate of a head on a task is proportional to it,
  theory.task_allocation), so a race's measured winner is read the same way, with its *mass
  share* mu omega / sum_h |mu omega|.

Thresholds (the constants below; each decides which theory applies or whether a race has ended, never an agreement
with a number):
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch

from .config import ProblemConfig, make_generator, sample_prompts
from .engine import case_seed
from .model import MultiHeadAttention, per_prompt_reduced_losses


def held_out_generator(seed: int, device):
    """The generator of the held-out prompts of ``seed``: the stream named "held out" at that
    seed (numerics.engine.case_seed), never a training stream."""
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
    (numerics.train.shape_key) are evaluated ``stack_heads`` heads at a time as one program
    (numerics.train.StackedAttention.prompt_losses): the same prompts, the same losses to float
    rounding (the heads of many models summed in another order), one pass over each chunk per stack."""
    import numpy as np

    models = list(models)
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
    from .train import StackedAttention, shape_key

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


ALLOCATED_SHARE = 0.1
"""A trained model is allocated when, for every task, each head but the serving one carries at
most ALLOCATED_SHARE of the serving |mu| (and distinct tasks have distinct serving heads).
Why 0.1: at the allocated fixed point the off-task mu are 0 and a converged run leaves them at
the SGD-noise level (measured <= 0.01 at (2,2), L = 32..64); the run that left allocation
(tasks (2,3), L = 32, sigma 0.5: off-task mu -0.38 against 1.34) was at ~0.3.  Under the
factored metric an off-task mu decays only like 1/t (d mu/dt ~ -2|mu| dL/dmu with dL/dmu ~ mu),
so at t = 20..40 it is still 4-9% of the served one at r = 1 (measured): 0.1, not less."""

SUPERPOSED_SHARE = 0.2
"""A head serves several tasks (a superposition) when its second-largest |mu| is at least 20%
of its largest, and a task is served in signed superposition when heads of both signs carry at
least 20% of its largest |mu|.  docs/model.md's merged run has shares 1.8/3.42 = 0.53 and its factored
run ~0; the merged shares are 0.2-0.5 once the superposition has formed.  Also the share below
which theory's flow has decided a race before a run (boundary-fewer-heads)."""

WINNER_MASS_SHARE = 0.9
"""A task is allocated to its winning head when that head carries at least 90% of
sum_h |mu[h,i] omega[h,i]| (the initialisation boundaries' classification)."""

RACE_DECIDED_SHARE = 2.0 / 3.0
"""A race's winner counts as measured when the leading head carries at least 2/3 of
sum_h |mu omega| at t_end (the loser's share only falls after the race is decided, slowly when
one task is shared by two heads: at t_end = 40 the measured shares were either >= 0.92 or
between 0.5 and 0.88 with the argmax fixed); below, the race has not ended."""


@dataclass(frozen=True)
class Allocation:
    """The allocation readout of one (H, m) pair (omega, mu); see the module docstring."""

    serving_head: tuple          # per task: argmax_h |mu[h, i]|
    same_sign_share: float       # largest off-task |mu| / serving |mu| among same-sign values
    opposite_sign_share: float   # ... among opposite-sign values (a superposition's mark)
    distinct_heads: bool         # distinct tasks on distinct serving heads
    winners: tuple               # per task: argmax_h mu[h, i] omega[h, i]
    mass_share: tuple            # the winner's share of sum_h |mu omega|
    head_share: tuple            # per head: second-largest |mu| over its largest (0: one task)
    runner_up_share: tuple       # per task: runner-up |mu| over the largest
    signed_superposed: tuple     # per task: heads of both signs carry >= SUPERPOSED_SHARE of it

    @property
    def allocated(self) -> bool:
        return bool(max(self.same_sign_share, self.opposite_sign_share) <= ALLOCATED_SHARE and self.distinct_heads)

    @property
    def superposition(self) -> bool:
        """Left allocation for a signed superposition: an opposite-sign off-task value at least
        SUPERPOSED_SHARE of the serving one."""
        return bool(self.opposite_sign_share >= SUPERPOSED_SHARE)

    @property
    def race_decided(self) -> bool:
        return bool(min(self.mass_share) >= RACE_DECIDED_SHARE) if self.mass_share else True

    @property
    def mass_allocated(self) -> bool:
        return bool(min(self.mass_share) >= WINNER_MASS_SHARE) if self.mass_share else True

    def to_dict(self) -> dict:
        keys = ("serving_head", "same_sign_share", "opposite_sign_share", "distinct_heads", "allocated",
                "superposition", "winners", "mass_share", "head_share", "runner_up_share", "signed_superposed")
        return {k: list(v) if isinstance(v := getattr(self, k), tuple) else v for k in keys}


def _second_over_first(values) -> float:
    a = np.sort(np.abs(np.asarray(values, float)))
    return float(a[-2] / a[-1]) if a.size > 1 and a[-1] > 0 else 0.0


def allocation(omega, mu) -> Allocation:
    """The readout of (omega, mu) (each H x m; omega may be None when only mu is known: then
    the winners and mass shares use |omega| = 1)."""
    mu = np.asarray(mu, float)
    omega = np.ones_like(mu) if omega is None else np.asarray(omega, float)
    serving = np.abs(mu).argmax(axis=0)
    same, opposite = 0.0, 0.0
    for i, h in enumerate(serving):
        ref = mu[h, i]
        for k in range(mu.shape[0]):
            if k == h or ref == 0:
                continue
            share = abs(mu[k, i] / ref)
            if mu[k, i] * ref >= 0:
                same = max(same, share)
            else:
                opposite = max(opposite, share)
    B = mu * omega
    win = np.argmax(B, axis=0)
    tot = np.abs(B).sum(axis=0)
    mass = [float(B[w, i] / tot[i]) if tot[i] > 0 else 0.0 for i, w in enumerate(win)]
    top = np.abs(mu).max(axis=0)
    signed = [bool(np.any(mu[:, i] > SUPERPOSED_SHARE * top[i]) and np.any(mu[:, i] < -SUPERPOSED_SHARE * top[i]))
              for i in range(mu.shape[1])]
    return Allocation(serving_head=tuple(int(h) for h in serving), same_sign_share=float(same),
                      opposite_sign_share=float(opposite), distinct_heads=len(set(serving.tolist())) == mu.shape[1],
                      winners=tuple(int(h) for h in win), mass_share=tuple(mass),
                      head_share=tuple(_second_over_first(row) for row in mu),
                      runner_up_share=tuple(_second_over_first(mu[:, i]) for i in range(mu.shape[1])),
                      signed_superposed=tuple(signed))


OUTCOME_CLASSES = ("allocated", "superposition", "off D", "mixed", "not converged", "diverged")
"""Where a trained run ends, by precedence (:func:`end_class`): ``diverged`` (the loss blew up:
numerics.train.TrainingDiverged), ``not converged`` (still in its warm-up, or the loss it could
still lose exceeds its comparison's tolerance: numerics.experiments.converged.converged_for),
``off D`` (its movable off-D part built by the flow: numerics.experiments.starts.off_D_test),
``superposition`` (on k of the m tasks: heads of both signs carry >= SUPERPOSED_SHARE of the
task, :attr:`Allocation.signed_superposed`), ``allocated`` (:attr:`Allocation.allocated`),
``mixed`` (none of these: heads sharing tasks with one sign, or fewer heads than tasks).  The
order is that of what each class needs: a class is read only once the run has converged, and
the readout of (omega, mu) means what it says only on D."""


@dataclass(frozen=True)
class EndClass:
    """The class of one run's end state (:data:`OUTCOME_CLASSES`); ``superposed``: how many of
    its ``tasks`` are in signed superposition (the k of "superposition on k of m tasks");
    ``reason``: why a run is not converged or diverged."""

    name: str
    superposed: int
    tasks: int
    reason: str = ""

    @property
    def label(self) -> str:
        """The class as counted: a superposition on k of m tasks is its own class for each k."""
        return f"superposition on {self.superposed} of {self.tasks} tasks" if self.name == "superposition" else self.name

    def to_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "superposed": self.superposed, "tasks": self.tasks,
                "reason": self.reason}


def end_class(readout, *, off_D: bool, converged: bool, diverged: bool = False, reason: str = "") -> EndClass:
    """The one classifier of a trained run's end state (:data:`OUTCOME_CLASSES`, by precedence)
    from its final readout (an :class:`Allocation`, or its ``to_dict()`` as stored; None for a
    diverged run), whether its movable off-D part was built by the flow (``off_D``) and whether it
    has converged; ``reason`` is kept for a run not converged or diverged."""
    if readout is None:
        if not diverged:
            raise ValueError("end_class needs the run's readout (numerics.evaluate.allocation) unless it diverged")
        return EndClass("diverged", 0, 0, reason)
    a = readout.to_dict() if isinstance(readout, Allocation) else readout
    signed = list(a["signed_superposed"])
    k, m = int(sum(bool(x) for x in signed)), len(signed)
    if diverged:
        return EndClass("diverged", 0, m, reason)
    if not converged:
        return EndClass("not converged", k, m, reason)
    if off_D:
        return EndClass("off D", k, m)
    if k > 0:
        return EndClass("superposition", k, m)
    return EndClass("allocated" if a["allocated"] else "mixed", 0, m)


ZERO_SUM_SHARE = 0.1
"""A task is carried by a zero-sum group of OV values when |sum_h mu[h, i]| is at most 10% of
sum_h |mu[h, i]|: the heads cancel the softmax's constant part (docs/model.md; He et al., ICML 2025).
The same 0.1 as the single-task boundary's pair ratio |mu_a + mu_b| / (|mu_a| + |mu_b|) < 0.1
(numerics.experiments.starts.single_task_summary), of which this is the many-head form; the measured pairs from
PyTorch's default start sit near 0 (3 of 3 runs), an allocated task at 1."""


def zero_sum_ratio(mu) -> tuple:
    """Per task |sum_h mu[h, i]| / sum_h |mu[h, i]| (1: one sign, 0: the heads cancel exactly;
    nan for a task no head carries)."""
    mu = np.asarray(mu, float)
    tot = np.abs(mu).sum(axis=0)
    return tuple(float(abs(mu[:, i].sum()) / tot[i]) if tot[i] > 0 else math.nan for i in range(mu.shape[1]))


def crossing_time(t, shares, threshold: float, eligible=None) -> float:
    """The first time a share reaches ``threshold`` (where ``eligible``, if given, is true:
    e.g. an off-task value on the opposite-sign branch), log-interpolated between the two
    records around the crossing; inf if it never does by the last record, the first record's
    time if it starts there.  The escape-time readout of the saddle and of the atlas."""
    t, s = np.asarray(t, float), np.asarray(shares, float)
    hit = s >= threshold
    if eligible is not None:
        hit &= np.asarray(eligible, bool)
    ok = np.flatnonzero(hit)
    if ok.size == 0:
        return math.inf
    j = int(ok[0])
    if j == 0:
        return float(t[0])
    a, b = math.log(max(s[j - 1], 1e-300)), math.log(s[j])
    f = (math.log(threshold) - a) / (b - a) if b > a else 1.0
    return float(t[j - 1] + min(max(f, 0.0), 1.0) * (t[j] - t[j - 1]))
