"""What a trained model is -- its held-out loss on fresh prompts and the allocation readout of its
(omega, mu) -- and the estimators of the precision of every measured number.

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
with a number).

The estimators, each once (after the readout): the tolerance multiplier :data:`Z_SE`, the mean
and its standard error (:func:`mean_se`), batch-means standard errors, the standard errors of
several means over the same groups (:func:`standard_error_along`) and of a mean of correlated
records (:func:`bounded_correlation_se`), paired ratios on common prompts, the least-squares line
and its slope's standard error (:func:`line_fit`), the L -> inf extrapolation of L * loss (claims
5-7 and the boundaries), the loss a run could still lose (the one convergence measure:
:func:`descent_left`), the lr -> 0 extrapolation of a rate (the saddle), the Clopper-Pearson
interval of a share (:func:`binomial_interval`) and the least-tolerance weights of a 1/s
extrapolation (:func:`least_tolerance_weights`).  The module loads no torch until a held-out
loss is asked for (its functions import it), so that claims.core, which reads the estimators,
loads without it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Optional

import numpy as np
import scipy.linalg
import scipy.optimize

from .engine import case_seed

if TYPE_CHECKING:
    import torch

    from .config import ProblemConfig
    from .model import MultiHeadAttention


def held_out_generator(seed: int, device):
    """The generator of the held-out prompts of ``seed``: the stream named "held out" at that
    seed (numerics.engine.case_seed), never a training stream."""
    from .config import make_generator

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
    import torch

    from .config import sample_prompts

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
    import torch

    from .model import per_prompt_reduced_losses

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
    (:func:`descent_left`).  ``stack_heads`` > 0: the models of one shape
    (numerics.train.shape_key) are evaluated ``stack_heads`` heads at a time as one program
    (numerics.train.StackedAttention.prompt_losses): the same prompts, the same losses to float
    rounding (the heads of many models summed in another order), one pass over each chunk per stack."""
    import torch

    from .config import sample_prompts

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
    import torch

    from .config import sample_prompts

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


# ---------------------------------------------------------------------------------------
# the estimators of the precision of what is measured
# ---------------------------------------------------------------------------------------

Z_SE = 4.0
"""The one tolerance policy for Monte-Carlo comparisons: a measured number agrees with its
prediction within Z_SE = 4 standard errors of its Monte-Carlo noise (plus any systematic
error the theory states).  Why 4: a report holds of the order of 100 such comparisons; a
Gaussian deviation beyond 4 standard errors has probability 6e-5, so a correct prediction
fails somewhere in the report by chance with probability ~0.6% (at 3 standard errors,
probability 2.7e-3 each, it would be ~25%), while a real discrepancy of a few standard
errors -- what the perturbation checks send through the same comparison -- is still caught.
The same constant bounds one-sided statistics (a trend "p + Z_SE se(p) < 0") and tail
bounds of accumulated noise (Z_SE x rms), and decides convergence: a run is converged for a
comparison of tolerance tol when the loss it could still lose is at most tol / Z_SE
(numerics.experiments.converged.converged_for).  Defined here, beside the estimators, so that
claims.core and numerics.experiments read the same number."""

NON_FINITE_POLICIES = ("keep", "drop")


def mean_se(values, *, non_finite: str = "keep") -> tuple[Optional[float], Optional[float]]:
    """The sample mean xbar = sum x_i / n and its standard error s / sqrt(n), with
    s^2 = sum (x_i - xbar)^2 / (n - 1) (the unbiased variance, ``ddof=1``).

    ``non_finite``: ``"keep"`` (a NaN or infinite value -- a diverged run -- shows in the mean
    instead of vanishing) or ``"drop"`` (None, NaN and infinities are left out first: a point
    that could not be measured is not a number of the sample).  The standard error is None from
    fewer than two values; both are None from no value."""
    if non_finite not in NON_FINITE_POLICIES:
        raise ValueError(f"non_finite must be one of {NON_FINITE_POLICIES}, got {non_finite!r}")
    if non_finite == "drop":
        values = [v for v in values if v is not None and math.isfinite(v)]
    x = np.asarray(values, float).ravel()
    if x.size == 0:
        return None, None
    with np.errstate(invalid="ignore"):   # "keep": inf - inf in the variance is the NaN it should be
        se = float(x.std(ddof=1) / math.sqrt(x.size)) if x.size > 1 else None
        return float(x.mean()), se


@dataclass(frozen=True)
class LineFit:
    """The ordinary least-squares line y = slope x + intercept through n points:
    slope = sum (x_i - xbar)(y_i - ybar) / sum (x_i - xbar)^2, intercept = ybar - slope xbar,
    and the slope's standard error sqrt(s^2 / sum (x_i - xbar)^2) with the residual variance
    s^2 = sum r_i^2 / (n - 2) (nan from two points: no degree of freedom left); ``residual_sd``
    is s."""

    slope: float
    intercept: float
    slope_se: float
    n: int
    residual_sd: float


def line_fit(x, y) -> LineFit:
    """The least-squares line of y on x (:class:`LineFit`); ValueError from fewer than two
    points, a length mismatch or a single distinct x (the slope is not defined)."""
    x, y = np.asarray(x, float).ravel(), np.asarray(y, float).ravel()
    if x.size != y.size:
        raise ValueError(f"line_fit needs as many y as x values, got {x.size} x and {y.size} y")
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError(f"line_fit needs at least two distinct x values, got {x.tolist()}")
    A = np.stack([x, np.ones_like(x)], axis=1)
    coef, *_ = np.linalg.lstsq(A, y, rcond=None)
    resid = y - A @ coef
    s2 = float(resid @ resid / (x.size - 2)) if x.size > 2 else math.nan
    return LineFit(slope=float(coef[0]), intercept=float(coef[1]),
                   slope_se=float(math.sqrt(s2 / np.sum((x - x.mean()) ** 2))), n=int(x.size),
                   residual_sd=math.sqrt(s2))


def standard_error_along(values, axis: int = 0):
    """The standard error s / sqrt(n) of the mean of each slice along ``axis`` (n its length,
    s^2 = sum (x_i - xbar)^2 / (n - 1)): :func:`mean_se`'s standard error for several
    quantities measured on the same n independent groups at once (e.g. one per entry).
    ValueError from fewer than two values along ``axis``."""
    x = np.asarray(values, float)
    n = x.shape[axis]
    if n < 2:
        raise ValueError(f"a standard error needs at least two values along axis {axis}, got {n}")
    return np.std(x, axis=axis, ddof=1) / math.sqrt(n)


def bounded_correlation_se(records, rho) -> tuple[np.ndarray, np.ndarray]:
    """(se, width) per entry of the mean of the n records ``records`` (n, ...) of a stationary process whose lag-k
    autocorrelation is at most ``rho``^k (rho per entry where an array, 0 <= rho < 1): the reading with all the
    variance in that slowest mode, no autocorrelation estimated.  With g = 1 + 2 sum_{k<n} (1 - k/n) rho^k,

        width^2 = sum (x_i - xbar)^2 / (n - g),    se = width sqrt(g / n).

    Both are the exact unbiased AR(1) readings at that rho; for any process within the bound
    Var(xbar) = sigma^2 f / n and E sum (x_i - xbar)^2 = sigma^2 (n - f) with f <= g, so neither is below the truth in
    expectation.  Why not estimate rho: from a tail a few correlation times long the lag-1 estimate scatters by
    ~1/sqrt(n), and the AR(1) se scales as 1/(1 - rho): one such tail read 10 x the scatter of independent runs' tail
    means, another a third of it."""
    x = np.asarray(records, float)
    n = x.shape[0]
    rho = np.asarray(rho, float)
    if n < 2 or np.any(rho < 0) or np.any(rho >= 1):
        raise ValueError(f"need at least 2 records and 0 <= rho < 1; got {n} records, rho {rho.tolist()}")
    k = np.arange(1, n).reshape((-1,) + (1,) * rho.ndim)
    g = 1.0 + 2.0 * np.sum((1.0 - k / n) * rho[None] ** k, axis=0)
    width = np.sqrt(np.sum((x - x.mean(axis=0)) ** 2, axis=0) / (n - g))
    return width * np.sqrt(g / n), width


def loss_standard_error(losses: np.ndarray, blocks: int = 10) -> float:
    """Standard error of the mean of per-step batch losses by batch means: the window is cut
    into ``blocks`` contiguous blocks and the block means treated as independent, which
    accounts for the autocorrelation the parameter noise of SGD puts between steps."""
    losses = np.asarray(losses, float)
    k = max(2, min(blocks, losses.size // 2))
    means = np.array([b.mean() for b in np.array_split(losses, k)])
    return mean_se(means)[1]


def paired_ratio(single: np.ndarray, multi: np.ndarray) -> tuple[float, float]:
    """R = mean(single) / mean(multi) on the same prompts, and its delta-method standard error
    sqrt(var(single - R multi) / n) / mean(multi) (pairing removes the common prompt noise)."""
    single, multi = np.asarray(single, float), np.asarray(multi, float)
    R = single.mean() / multi.mean()
    se = float(mean_se(single - R * multi)[1] / multi.mean())
    return float(R), se


CORRECTION_POWERS = (1.0, 0.5)
"""The finite-L correction of L * loss (and of ratios of such losses) is fitted as c L^-p with
p = 1 (the expansion's O(1/L) term) and p = 1/2.  Why both: the expansion's remainder is
O(L^-2) only while the third cumulant of the softmax weights has a finite Gaussian average
(6 omega^2 < 1); at the optimum omega ~ 0.39..0.55 for r <= 4 it is not, the remainder is
O(L^{-1-alpha}) with 0 < alpha < 1, and the measured approach of L * loss to its limit is
indeed slower than 1/L (r = 1: 7.08, 7.52, 8.08, 8.36 at L = 256, 1024, 4096, 8192 against
8.44).  The two fits bracket the extrapolation; their midpoint is reported and half their
difference is the systematic error of the extrapolation."""

def fit_limit(L, y, se) -> dict:
    """Extrapolate y(L) to L -> inf from the weighted fits y = a + c L^-p, p in
    CORRECTION_POWERS: a = midpoint of the two intercepts, a_se = the larger of their
    Monte-Carlo standard errors, systematic = half their difference."""
    L, y, se = (np.asarray(v, float) for v in (L, y, se))
    if L.size < 3:
        raise ValueError(f"the L -> inf extrapolation needs at least 3 context lengths, got {L.size}")
    if np.any(~np.isfinite(se)) or np.any(se <= 0):
        raise ValueError(f"standard errors must be positive and finite, got {se.tolist()}")
    fits, wt = {}, 1.0 / se ** 2
    for p in CORRECTION_POWERS:     # weighted least squares of y = a + c L^-p: (a, c), covariance, chi^2
        X = np.stack([np.ones_like(L), L ** -p], axis=1)
        cov = np.linalg.inv(X.T @ (X * wt[:, None]))
        coef = cov @ (X.T @ (wt * y))
        fits[p] = {"a": float(coef[0]), "a_se": float(math.sqrt(cov[0, 0])), "c": float(coef[1]),
                   "chi2": float(np.sum(((y - X @ coef) / se) ** 2))}
    a1, a2 = (fits[p]["a"] for p in CORRECTION_POWERS)
    return {"a": 0.5 * (a1 + a2), "a_se": max(f["a_se"] for f in fits.values()),
            "systematic": 0.5 * abs(a1 - a2), "dof": int(L.size - 2),
            "fits": {f"p={p:g}": f for p, f in fits.items()}}


def window_drift(tail: np.ndarray, z: float) -> float:
    """The part of the change of the loss between the two halves of the final window that
    Monte-Carlo noise does not explain: max(0, |mean_1 - mean_2| - z se(mean_1 - mean_2)), the
    se by batch means within each half (z: the caller's standard errors, claims.core.Z_SE).
    An estimate of the optimisation error left (a run still descending), zero for a run that
    has converged to within its noise."""
    halves = np.array_split(np.asarray(tail, float), 2)
    se = math.hypot(*(loss_standard_error(h, 5) for h in halves))
    return max(0.0, abs(float(halves[0].mean() - halves[1].mean())) - z * se)


def extrapolate_to_zero(x, y, se) -> dict:
    """y(x) extrapolated to x -> 0 from measurements y +- se at n >= 2 distinct x > 0 (the
    saddle's growth rate at several steps lr): the polynomial of degree n - 1 through every
    point (Richardson), a = sum_k w_k y_k with the Lagrange weights w_k of the points at 0,
    a_se = sqrt(sum_k (w_k se_k)^2); ``systematic`` = half the change of a when the largest x
    is left out (degree n - 2 through the others; with n = 2 the value at the smallest x): the
    part of the extrapolation its own points cannot pin, from the measurements alone."""
    x, y, se = (np.asarray(v, float) for v in (x, y, se))
    if x.ndim != 1 or x.size < 2 or y.shape != x.shape or se.shape != x.shape:
        raise ValueError(f"the extrapolation needs >= 2 points (x, y, se of one length), got {x.size}")
    if np.any(~np.isfinite(x)) or np.any(x <= 0) or np.unique(x).size != x.size:
        raise ValueError(f"x must be distinct, positive and finite, got {x.tolist()}")
    if np.any(~np.isfinite(y)) or np.any(~np.isfinite(se)) or np.any(se < 0):
        raise ValueError(f"y and se must be finite (se >= 0), got y={y.tolist()}, se={se.tolist()}")

    def at_zero(idx):
        xs = x[idx]
        w = np.array([np.prod([-xj / (xi - xj) for j, xj in enumerate(xs) if j != i]) for i, xi in enumerate(xs)])
        return float(w @ y[idx]), float(math.sqrt(np.sum((w * se[idx]) ** 2))), w

    order = np.argsort(x)
    a, a_se, w = at_zero(order)
    b, _, _ = at_zero(order[:-1])
    return {"a": a, "a_se": a_se, "systematic": 0.5 * abs(a - b), "lower_order": b, "weights": w.tolist(),
            "x": x[order].tolist(), "degree": int(x.size - 1)}


@dataclass(frozen=True)
class DescentLeft:
    """The loss a run could still lose, from paired snapshots at the end of its final stage
    (:func:`descent_left`): ``rate`` (descent per unit time, > 0 while the loss falls) +-
    ``rate_se``, ``jitter`` (the residual sd of the snapshots' losses about the fitted line: the
    iterates' fluctuation plus Monte-Carlo noise), the ``window`` (first and last snapshot time),
    ``points`` snapshots, the ``horizon`` and ``left`` = max(0, rate + rate_se) x horizon."""

    rate: float
    rate_se: float
    jitter: float
    window: tuple
    points: int
    horizon: float
    left: float

    def to_dict(self) -> dict:
        return asdict(self)


def descent_left(t, losses, horizon: float) -> DescentLeft:
    """The loss a run could still lose over ``horizon`` at its recent descent rate.

    ``t`` (k,): snapshot times over the second half of the run's final stage (the first half
    absorbs the relaxation from the previous stage's SGD noise level to this one's, so the
    window sees the descent left, not the noise's relaxation); ``losses`` (k, n): each
    snapshot's per-prompt loss on the SAME n prompts.  The rate is minus the least-squares
    slope of the snapshots' mean losses in t.  Its standard error is the larger of the paired
    Monte-Carlo one (the sd over prompts of each prompt's own slope, / sqrt n: common prompts
    cancel the prompt noise) and the one the residual scatter about the line gives
    (jitter / sqrt(sum (t - tbar)^2)): the iterates fluctuate together on every prompt, which
    pairing cannot remove.  ``left`` counts the rate one standard error above its estimate, so
    a descent the noise hides is not taken for none; the horizon is the caller's (the
    converged schedule: the final stage's length, "as long again")."""
    t = np.asarray(t, float)
    losses = np.asarray(losses, float)
    if t.ndim != 1 or t.size < 3 or losses.ndim != 2 or losses.shape[0] != t.size or losses.shape[1] < 2:
        raise ValueError(f"descent_left needs >= 3 snapshot times and a (snapshots, prompts) loss array, got t of "
                         f"shape {t.shape} and losses of shape {losses.shape}")
    if np.ptp(t) <= 0 or not (math.isfinite(horizon) and horizon > 0):
        raise ValueError(f"the snapshot times must differ and the horizon be positive, got t={t.tolist()}, "
                         f"horizon={horizon!r}")
    tc = t - t.mean()
    sxx = float(tc @ tc)
    means = losses.mean(axis=1)
    slope = float(tc @ means / sxx)
    per_prompt = tc @ losses / sxx
    se_mc = mean_se(per_prompt)[1]
    resid = means - means.mean() - slope * tc
    jitter = float(math.sqrt(resid @ resid / (t.size - 2)))
    rate, rate_se = -slope, max(se_mc, jitter / math.sqrt(sxx))
    return DescentLeft(rate=rate, rate_se=rate_se, jitter=jitter, window=(float(t[0]), float(t[-1])),
                       points=int(t.size), horizon=float(horizon), left=max(0.0, rate + rate_se) * float(horizon))


def binomial_interval(k: int, n: int, z: float) -> tuple[float, float]:
    """The Clopper-Pearson interval [lo, hi] of a share k / n at two-sided level
    alpha = erfc(z / sqrt 2) (the probability that a normal deviate exceeds z standard errors
    either way: z = 4 gives 6.3e-5):

        lo = Beta^-1(alpha / 2; k, n - k + 1)   (0 for k = 0),
        hi = Beta^-1(1 - alpha / 2; k + 1, n - k)   (1 for k = n).

    Why Clopper-Pearson and not Wilson: it inverts the two one-sided binomial tests exactly, so
    its coverage is at least 1 - alpha for every true share and every n (Wilson's dips below
    its nominal level at small n, and a report's seed counts are small: 8 or 16); a true share
    lies outside it with probability at most alpha, so a share comparison at z = Z_SE fails a
    right prediction as rarely as a Monte-Carlo one does (claims.core.Z_SE).  At n = 8 and
    z = 4: 8 of 8 gives [0.27, 1], 4 of 8 [0.026, 0.97], 7 of 8 [0.17, 1 - 4e-6] (one run of
    another class rejects a share of 1); at n = 16, 16 of 16 gives [0.52, 1]."""
    from scipy.special import betaincinv, erfc

    if isinstance(k, bool) or isinstance(n, bool) or int(k) != k or int(n) != n or not 0 <= k <= n or n < 1:
        raise ValueError(f"a binomial interval needs integers 0 <= k <= n, n >= 1; got k={k!r}, n={n!r}")
    if not (math.isfinite(z) and z > 0):
        raise ValueError(f"z must be a finite number > 0, got {z!r}")
    k, n = int(k), int(n)
    alpha = float(erfc(z / math.sqrt(2.0)))
    lo = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, alpha / 2))
    hi = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1 - alpha / 2))
    return lo, hi


def least_tolerance_weights(scales, variance, linear) -> np.ndarray:
    """The weights a of the unbiased linear estimate C = sum_j a_j T_j of T(s0) = C/s0 + c0 (sum_j a_j / s_j = 1,
    sum_j a_j = 0: exact for every c0) whose tolerance sqrt(sum_j a_j^2 variance_j) + sum_j |a_j| linear_j is
    smallest: weighted least squares with the runs' own noise (``variance``: Z_SE^2 x the variance of T_j) and
    resolution/theory parts (``linear``), all fixed before any T is compared.  With two scales the weights are
    determined (1 / (1/s_1 - 1/s_2) and its negative); with more, the ordinary least-squares weights are moved along
    the constraints' null space (the SGD escape spread grows fast as s0 falls, so the smallest s0 is weighted less)."""
    s = np.asarray(scales, float)
    A = np.stack([1.0 / s, np.ones_like(s)])
    start = np.linalg.pinv(A.T)[0]
    null = scipy.linalg.null_space(A)
    if null.shape[1] == 0:
        return start

    def tolerance(x):
        a = start + null @ x
        return math.sqrt(float(np.sum(a ** 2 * variance))) + float(np.abs(a) @ linear)

    best = scipy.optimize.minimize(tolerance, np.zeros(null.shape[1]), method="Nelder-Mead",
                                   options={"xatol": 1e-10, "fatol": 1e-14})
    return start + null @ best.x if best.fun < tolerance(np.zeros(null.shape[1])) else start
