"""The reduced flow driven by the Rao-Blackwellised marginals (train_reduced(estimator=
"marginal")): the same flow as the whole-prompt reduced flow within Monte-Carlo error, the
same loss in expectation, exact reproduction by seed, its hand-written gradient against
autograd, checkpoints that name their estimator; and train_reduced leaves a caller's start
arrays alone."""
import math

import numpy as np
import pytest
import torch

from numerics.config import ProblemConfig
from numerics.config import make_generator
from numerics.exact_reduced import marginal_losses, marginal_mean_loss, sample_marginal_prompts
from numerics.model import metric_factors
from numerics.train import ESTIMATORS, TrainConfig, train_reduced

CFG = ProblemConfig(tasks=(2, 2), heads=2, L=16, sigma=0.5)
OM0 = np.array([[0.4, 0.1], [0.1, 0.3]])
MU0 = np.array([[0.5, 0.2], [0.1, 0.6]])
Z = 4.0   # two-sided z bound: false alarm 6e-5 per comparison (8 coordinates: 5e-4 in all)


def frozen(omega, mu):
    """Metric factors 0: the parameters stay at the start, each step's loss is an independent
    estimate of L_L there."""
    return torch.zeros_like(omega), torch.zeros_like(mu)


def final_values(estimator, seeds, metric=None, tcfg=None):
    tcfg = tcfg or TrainConfig(lr=0.05, time=2.0, batch=512, records=2)
    out = []
    for seed in seeds:
        r = train_reduced(CFG, TrainConfig(**{**tcfg.to_dict(), "seed": seed}), start=(OM0, MU0),
                          estimator=estimator, metric=metric)
        out.append(np.concatenate([r.omega.ravel(), r.mu.ravel()]))
    return np.array(out)


@pytest.mark.parametrize("estimator", ESTIMATORS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_start_arrays_are_not_overwritten(estimator, dtype):
    """torch.as_tensor shares memory with a float64 numpy array: the trainer must copy it."""
    om, mu = OM0.copy(), MU0.copy()
    r = train_reduced(CFG.replace(dtype=dtype), TrainConfig(lr=0.05, time=0.2, batch=64, records=2),
                      start=(om, mu), estimator=estimator)
    assert np.array_equal(om, OM0) and np.array_equal(mu, MU0)
    assert not np.allclose(r.mu, MU0)       # and the run did move
    t_om, t_mu = torch.tensor(OM0), torch.tensor(MU0)
    train_reduced(CFG, TrainConfig(lr=0.05, time=0.1, batch=64, records=2), start=(t_om, t_mu),
                  estimator=estimator)
    assert torch.equal(t_om, torch.tensor(OM0)) and torch.equal(t_mu, torch.tensor(MU0))


@pytest.mark.parametrize("blocks_major", [True, False])
@pytest.mark.parametrize("chunk", [None, 7, 1000])
def test_hand_written_gradient_matches_autograd(blocks_major, chunk):
    """marginal_mean_loss (chunked, gradient by hand) = autograd through marginal_losses().mean()
    to float64 rounding (sums of n L terms of size O(1): relative error ~ 1e-14)."""
    tasks, L, n = (3, 1, 2), 24, 300
    pr = sample_marginal_prompts(tasks, L, n, make_generator(5, "cpu"), blocks_major=blocks_major)
    rng = np.random.default_rng(1)
    om = torch.tensor(rng.uniform(-0.6, 0.6, (4, 3)), requires_grad=True)
    mu = torch.tensor(rng.uniform(-1, 1, (4, 3)), requires_grad=True)
    ref = marginal_losses(om, mu, pr, tasks, 0.7).mean()
    g_ref = torch.autograd.grad(ref, [om, mu])
    val = marginal_mean_loss(om, mu, pr, tasks, 0.7, chunk=chunk)
    g = torch.autograd.grad(3.0 * val, [om, mu])          # the incoming gradient is applied
    assert float(val.detach()) == pytest.approx(float(ref.detach()), rel=1e-13)
    for a, b in zip(g, g_ref):
        assert torch.allclose(a, 3.0 * b, rtol=1e-12, atol=1e-13 * float(b.abs().max()))
    # and a wrong loss is told apart: sigma off by 1e-3 moves the mu gradient beyond 1e-12
    g_bad = torch.autograd.grad(marginal_mean_loss(om, mu, pr, tasks, 0.701, chunk=chunk), [om, mu])
    assert not torch.allclose(g_bad[1], g_ref[1], rtol=1e-9, atol=0)


def test_marginal_loss_has_the_same_expectation():
    """At a fixed point (metric factors 0), 400 independent batch losses of each estimator:
    their means agree within Z standard errors; the same test tells apart the loss at mu
    scaled by 1.2 (its power)."""
    tcfg = TrainConfig(lr=0.05, time=20.0, batch=256, records=2)
    whole = train_reduced(CFG, tcfg, start=(OM0, MU0), metric=frozen).losses
    rb = train_reduced(CFG, TrainConfig(**{**tcfg.to_dict(), "seed": 1}), start=(OM0, MU0),
                       metric=frozen, estimator="marginal").losses
    assert np.ptp(whole) > 0 and np.ptp(rb) > 0          # fresh batches, not one repeated

    def z(a, b):
        return (a.mean() - b.mean()) / math.sqrt(a.var(ddof=1) / a.size + b.var(ddof=1) / b.size)

    assert abs(z(whole, rb)) < Z, (whole.mean(), rb.mean())
    # Rao-Blackwellisation: the marginal batch loss varies less than the whole-prompt one
    assert rb.var() < whole.var()
    off = train_reduced(CFG, TrainConfig(**{**tcfg.to_dict(), "seed": 2}), start=(OM0, 1.2 * MU0),
                        metric=frozen, estimator="marginal").losses
    assert abs(z(whole, off)) > Z and abs(z(rb, off)) > Z


def test_trajectory_agrees_with_the_whole_prompt_flow():
    """Six seeds of each flow to t = 2 (40 steps, batch 512) from a point where the values
    move by 0.1-0.6: the mean final (omega, mu) agree coordinate by coordinate within Z
    standard errors (the two estimators have the same expected gradient at every point, so
    the mean flows differ by O(lr * var / batch), far below the errors); a flow with a
    metric off by 20% is told apart."""
    seeds = range(6)
    whole, rb = final_values("prompts", seeds), final_values("marginal", seeds)
    start = np.concatenate([OM0.ravel(), MU0.ravel()])

    def zs(a, b):
        se = np.sqrt(a.var(axis=0, ddof=1) / len(a) + b.var(axis=0, ddof=1) / len(b))
        return (a.mean(axis=0) - b.mean(axis=0)) / se

    assert np.all(np.abs(zs(whole, rb)) < Z), zs(whole, rb)
    assert np.abs(rb.mean(axis=0) - start).max() > 0.3          # it did move
    wrong = lambda o, m: tuple(1.2 * f for f in metric_factors(o, m, CFG))  # noqa: E731
    assert np.abs(zs(whole, final_values("marginal", seeds, metric=wrong))).max() > Z


def test_seeds_reproduce_exactly_and_differ_between_seeds():
    tcfg = TrainConfig(lr=0.05, time=0.5, batch=128, records=3)
    a = train_reduced(CFG, tcfg, estimator="marginal")
    b = train_reduced(CFG, tcfg, estimator="marginal")
    assert np.array_equal(a.losses, b.losses) and np.array_equal(a.omega, b.omega)
    assert [r.omega for r in a.trajectory] == [r.omega for r in b.trajectory]
    assert a.model == "reduced" and len(a.trajectory) == 3 and a.trajectory[-1].residual == 0.0
    c = train_reduced(CFG, TrainConfig(**{**tcfg.to_dict(), "seed": 1}), estimator="marginal")
    assert not np.array_equal(a.losses, c.losses)
    # a fixed batch (fresh_batches=False) reproduces too, and the float32 run sees the same draws
    fixed = TrainConfig(**{**tcfg.to_dict(), "fresh_batches": False})
    f1, f2 = (train_reduced(CFG, fixed, estimator="marginal") for _ in range(2))
    assert np.array_equal(f1.losses, f2.losses)
    f32 = train_reduced(CFG.replace(dtype="float32"), tcfg, estimator="marginal")
    assert np.allclose(f32.losses, a.losses, rtol=1e-4)


def test_checkpoint_resumes_bit_identically_and_names_the_estimator(tmp_path):
    path = str(tmp_path / "ck.pt")
    tcfg = TrainConfig(lr=0.05, time=0.5, batch=64, records=3, checkpoint=path, checkpoint_every=4)
    whole = train_reduced(CFG, TrainConfig(**{**tcfg.to_dict(), "checkpoint": None}), estimator="marginal")
    first = train_reduced(CFG, tcfg, estimator="marginal")       # writes checkpoints as it goes
    again = train_reduced(CFG, tcfg, estimator="marginal")       # resumes from the last one
    assert np.array_equal(whole.losses, first.losses) and np.array_equal(whole.losses, again.losses)
    assert np.array_equal(whole.omega, again.omega) and again.fingerprint == whole.fingerprint
    with pytest.raises(ValueError, match="estimator: checkpoint 'marginal', this run 'prompts'"):
        train_reduced(CFG, tcfg)


def test_bad_estimator_and_batch_source():
    tcfg = TrainConfig(lr=0.05, time=0.1, batch=16, records=2)
    with pytest.raises(ValueError, match="estimator must be one of"):
        train_reduced(CFG, tcfg, estimator="rb")
    fixed = sample_marginal_prompts(CFG.tasks, CFG.L, 16, make_generator(0, "cpu"))
    r = train_reduced(CFG, tcfg, estimator="marginal", batches=lambda k: fixed)
    assert r.steps == 2 and np.isfinite(r.loss)


# --- many reduced flows as one program (numerics.train.train_reduced_many, issues 28 and 34)

import re                                            # noqa: E402

from numerics.model import TrainingDiverged          # noqa: E402
from numerics.train import train_reduced_many        # noqa: E402


@pytest.fixture
def one_torch_thread():
    """One torch thread, as the claims train (numerics.experiments.one_thread): with two on a
    loaded 2-core machine these small batched products ran ~30x slower (15 s against 0.5 s)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

BATCHED_RTOL = 1e-12
"""float64: the batched program does a run's arithmetic with the runs on a batch axis (other
kernels, other summation orders over B <= 512 prompts and L <= 64 tokens), so a record differs
from the run alone by a few ulps a step, grown by at most the flow's contraction over <= 100
steps: ~1e-14 measured; 1e-12 leaves two decades.  A different prompt stream moves a record by
~1e-2 (the Monte-Carlo error of a batch), ten decades above."""


def skewed(omega, mu):
    """A metric of its own (not theory's): each run's metric must reach only that run."""
    return 0.5 + 0.0 * omega, 1.5 + 0.0 * mu


def mixed_runs(cfg=CFG, batch=128, steps=30):
    """Runs of one shape that differ in everything else: two fresh streams shared by several
    runs, a fixed batch, a symmetrised stream, starts, metrics, logit scales, lengths, lrs."""
    lr = 0.05
    runs = []
    for seed, extra in ((1, {}), (1, {"time": lr * steps / 2}), (2, {"lr": 0.08}), (2, {}),
                        (3, {"fresh_batches": False}), (4, {"symmetrize": True})):
        tc = TrainConfig(**{"lr": lr, "time": lr * steps, "batch": batch, "records": 7, "seed": seed, **extra})
        runs.append((cfg.replace(logit_scale=1.0 + 0.5 * (len(runs) % 2)), tc))
    starts = [(OM0, MU0), None, (0.5 * OM0, MU0), None, (OM0, 0.5 * MU0), None]
    metrics = [None, skewed, None, None, skewed, None]
    return runs, starts, metrics


def max_relative_difference(a, b) -> float:
    """Worst |a - b| / max |a| over the per-step losses, the final values and every record."""
    def rel(x, y):
        x, y = np.asarray(x, float), np.asarray(y, float)
        return float(np.max(np.abs(x - y)) / max(np.max(np.abs(x)), 1e-300))
    assert a.steps == b.steps and [r.t for r in a.trajectory] == [r.t for r in b.trajectory]
    return max([rel(a.losses, b.losses), rel(a.omega, b.omega), rel(a.mu, b.mu), rel(a.loss, b.loss)]
               + [rel([ra.loss, *np.ravel(ra.omega), *np.ravel(ra.mu)], [rb.loss, *np.ravel(rb.omega), *np.ravel(rb.mu)])
                  for ra, rb in zip(a.trajectory, b.trajectory)])


@pytest.mark.usefixtures("one_torch_thread")
def test_reduced_many_equals_each_run_alone():
    """Each run of train_reduced_many = train_reduced of that run alone, to rounding, every
    record; and the comparison can fail: the same runs on other seeds' streams are far off."""
    runs, starts, metrics = mixed_runs()
    cfgs, tcfgs = zip(*runs)
    many = train_reduced_many(cfgs, tcfgs, start=starts, metric=metrics)
    alone = [train_reduced(c, t, start=s, metric=f) for c, t, s, f in zip(cfgs, tcfgs, starts, metrics)]
    assert all(r.batched_runs == len(runs) and r.model == "reduced" for r in many)
    worst = max(max_relative_difference(a, b) for a, b in zip(alone, many))
    assert worst <= BATCHED_RTOL, worst
    other = [train_reduced(c, TrainConfig(**{**t.to_dict(), "seed": t.seed + 10}), start=s, metric=f)
             for c, t, s, f in zip(cfgs, tcfgs, starts, metrics)]
    assert min(max_relative_difference(o, b) for o, b in zip(other, many)) > 1e3 * BATCHED_RTOL


@pytest.mark.usefixtures("one_torch_thread")
def test_reduced_many_draws_a_shared_stream_once(monkeypatch):
    """Four runs on two streams draw 2 batches a step, not 4."""
    import numerics.train as T
    calls = []
    real = T.sample_prompts
    monkeypatch.setattr(T, "sample_prompts", lambda *a, **k: calls.append(1) or real(*a, **k))
    tc = TrainConfig(lr=0.05, time=0.5, batch=64, records=2)
    tcfgs = [TrainConfig(**{**tc.to_dict(), "seed": s}) for s in (0, 0, 1, 1)]
    train_reduced_many([CFG] * 4, tcfgs, metric=[None, skewed, None, skewed])
    assert len(calls) == 2 * (tc.steps + 1)


@pytest.mark.usefixtures("one_torch_thread")
def test_reduced_many_ends_a_diverging_run_alone():
    """A diverging run's entry is the TrainingDiverged train_reduced raises (same message); a
    hook that raises ends its own run; the other runs are those trained alone."""
    tc = TrainConfig(lr=0.05, time=1.0, batch=64, records=5, seed=3)
    wild = TrainConfig(**{**tc.to_dict(), "lr": 0.5, "diverge_loss": 1e3})   # 150 at step 0, 5e11 at 2
    start = (np.full((2, 2), 3.0), np.full((2, 2), 3.0))

    def stop(step, t, state, loss):
        if step > 0:
            raise RuntimeError("stop here")
    many = train_reduced_many([CFG] * 3, [tc, wild, tc], start=[None, start, None], on_record=[None, None, stop])
    with pytest.raises(TrainingDiverged) as alone:
        train_reduced(CFG, wild, start=start)
    number = r"batch loss [0-9.e+]+"            # the same loss to rounding, printed to 17 digits
    assert isinstance(many[1], TrainingDiverged)
    assert re.sub(number, "", str(many[1])) == re.sub(number, "", str(alone.value)) and "step 0 " not in str(many[1])
    assert isinstance(many[2], RuntimeError) and "stop here" in str(many[2])
    assert max_relative_difference(train_reduced(CFG, tc), many[0]) <= BATCHED_RTOL


@pytest.mark.usefixtures("one_torch_thread")
def test_reduced_many_refuses_bad_input_first():
    tc = TrainConfig(lr=0.05, time=0.2, batch=64, records=2)
    with pytest.raises(ValueError, match="same length"):
        train_reduced_many([CFG] * 2, [tc] * 3)
    with pytest.raises(TypeError, match="metric"):
        train_reduced_many([CFG] * 2, tc, metric=[None, 3])
    with pytest.raises(ValueError, match="start omega0 must have shape"):
        train_reduced_many([CFG] * 2, tc, start=[None, (np.zeros((1, 2)), np.zeros((1, 2)))])
    assert train_reduced_many([], []) == []


@pytest.mark.thorough
@pytest.mark.parametrize("dtype, rtol", [("float64", BATCHED_RTOL), ("float32", 1e-4)])
@pytest.mark.usefixtures("one_torch_thread")
def test_reduced_many_equals_each_run_alone_at_the_claims_size(dtype, rtol):
    """At boundary-initialisation's quick size (tasks 2,2, H = 2, L = 32, batch 512, 100 steps)
    and with a random task basis; float32 to its own rounding (~1e-7 a step, 1e-4 over the run)."""
    cfg = ProblemConfig(tasks=(2, 2), heads=2, L=32, basis="random", dtype=dtype)
    runs, starts, metrics = mixed_runs(cfg, batch=512, steps=100)
    cfgs, tcfgs = zip(*runs)
    many = train_reduced_many(cfgs, tcfgs, start=starts, metric=metrics)
    alone = [train_reduced(c, t, start=s, metric=f) for c, t, s, f in zip(cfgs, tcfgs, starts, metrics)]
    assert max(max_relative_difference(a, b) for a, b in zip(alone, many)) <= rtol
