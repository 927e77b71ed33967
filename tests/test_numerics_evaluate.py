"""The held-out loss: fresh prompts, honest standard error, the same number for the full
model and the reduced model at the same decomposable point."""
import numpy as np
import pytest
import torch

from numerics.config import ProblemConfig, make_generator, sample_prompts
from numerics.evaluate import held_out_loss, held_out_reduced_loss
from numerics.model import MultiHeadAttention, mse_loss

CFG = ProblemConfig(tasks=(3, 2), heads=2, L=16)


def test_full_and_reduced_agree_on_D_prompt_by_prompt():
    model = MultiHeadAttention(CFG)
    r = model.semi_singular_values()
    omega, mu = r.omega, r.mu
    a = held_out_loss(model, n=512, seed=3, chunk=100)
    b = held_out_reduced_loss(omega, mu, CFG, n=512, seed=3, chunk=100)
    assert a.n == b.n == 512
    assert abs(a.mean - b.mean) < 1e-10 and abs(a.se - b.se) < 1e-10


def test_standard_error_matches_the_spread_of_independent_estimates():
    model = MultiHeadAttention(CFG)
    est = [held_out_loss(model, n=256, seed=s) for s in range(40)]
    spread = np.std([e.mean for e in est], ddof=1)
    mean_se = np.mean([e.se for e in est])
    # the spread of 40 estimates has relative sampling error ~ 1/sqrt(78) ~ 11 %
    assert 0.6 < spread / mean_se < 1.5, (spread, mean_se)


def test_held_out_prompts_are_not_the_training_prompts():
    model = MultiHeadAttention(CFG)
    train_batch = sample_prompts(CFG, 256, make_generator(0, CFG.device))
    with torch.no_grad():
        on_train = float(mse_loss(model(train_batch.context, train_batch.query), train_batch.target))
    assert held_out_loss(model, n=256, seed=0).mean != on_train


@pytest.mark.parametrize("bad", [dict(n=1), dict(chunk=0), dict(n=2.5)])
def test_bad_sizes_are_refused(bad):
    with pytest.raises(ValueError, match="integer >= 2"):
        held_out_loss(MultiHeadAttention(CFG), **bad)


def test_paired_difference_is_the_difference_on_the_same_prompts_with_a_smaller_se():
    from numerics.evaluate import held_out_loss_difference
    a = MultiHeadAttention.from_semi_singular_values(CFG, [[0.4, 0.1], [0.1, 0.4]], [[1.0, 0.1], [0.1, 1.0]])
    b = MultiHeadAttention.from_semi_singular_values(CFG, [[0.41, 0.1], [0.1, 0.4]], [[1.02, 0.1], [0.1, 1.0]])
    la, lb = held_out_loss(a, n=2048, seed=5), held_out_loss(b, n=2048, seed=5)
    d = held_out_loss_difference(a, b, n=2048, seed=5)
    assert d.n == 2048 and abs(d.mean - (la.mean - lb.mean)) < 1e-10
    assert d.se < 0.2 * np.hypot(la.se, lb.se)       # close models: strongly correlated per-prompt losses
    other = MultiHeadAttention(ProblemConfig(tasks=(3, 2), heads=2, L=8))
    with pytest.raises(ValueError, match="same problem"):
        held_out_loss_difference(a, other)


def test_many_models_on_one_draw_equal_each_model_alone():
    from numerics.evaluate import held_out_losses
    models = [MultiHeadAttention(CFG.replace(init_scale=s)) for s in (0.1, 0.3)] + \
             [MultiHeadAttention(CFG.replace(init="random_full", init_seed=2, heads=3))]
    many = held_out_losses(models, n=700, seed=4, chunk=256)       # a partial last chunk too
    for m, est in zip(models, many):
        assert est == held_out_loss(m, n=700, seed=4, chunk=256)
    assert many[0] != many[1]
    with pytest.raises(ValueError, match="another problem"):
        held_out_losses([models[0], MultiHeadAttention(CFG.replace(L=8))])


def test_hessian_top_eigenvalue_is_the_population_hessians():
    """numerics.evaluate.hessian_top_eigenvalue (power iteration on Hessian-vector products, each on
    fresh prompts) against the top eigenvalue of the dense Hessian of every weight (33 weights) at
    a point of D with nonzero weights.  Both are Monte-Carlo estimates of the population's top
    eigenvalue, and both scatter by batch (the dense one on 2^15 prompts by ~2 %, the power
    iteration by ~3 %): three of each, compared at Z_SE standard errors of the difference of their
    means.  A Hessian off by 25 % either way is rejected by the same comparison."""
    import numpy as np

    from numerics.evaluate import hessian_top_eigenvalue
    from numerics.evaluate import Z_SE

    cfg = ProblemConfig(tasks=(1, 1), heads=1, L=8)
    model = MultiHeadAttention.from_semi_singular_values(cfg, [[0.4, 0.3]], [[0.9, 0.6]])
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    flat = torch.cat([p.detach().reshape(-1) for p in params])

    def dense_top(seed):
        pr = sample_prompts(cfg, 2 ** 15, make_generator(seed, "cpu"))

        def loss(x):
            parts = torch.split(x, sizes)
            weights = {name: part.view(p.shape) for (name, p), part in zip(model.named_parameters(), parts)}
            pred = torch.func.functional_call(model, weights, (pr.context, pr.query))
            return ((pred - pr.target) ** 2).sum(dim=-1).mean()
        return float(torch.linalg.eigvalsh(torch.autograd.functional.hessian(loss, flat)).max())

    dense = np.array([dense_top(s) for s in (5, 6, 7)])
    estimate = np.array([hessian_top_eigenvalue(model, n=8192, iters=32, seed=s) for s in (1, 2, 3)])
    se = float(np.sqrt(dense.var(ddof=1) / dense.size + estimate.var(ddof=1) / estimate.size))

    def agrees(predicted):
        return abs(estimate.mean() - predicted) <= Z_SE * se

    assert agrees(dense.mean()), (estimate, dense, se)
    assert not agrees(1.25 * dense.mean()) and not agrees(dense.mean() / 1.25), (estimate, dense, se)
