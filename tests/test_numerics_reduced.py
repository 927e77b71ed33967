"""The exact finite-L reduced model: equal to the full model on D, its gradient equal to the
full gradient projected onto D (chain rule), and the metric factors of both parametrisations.

Tolerances: float64 rounding (1e-12 on O(1) quantities) for identities that hold exactly on
a batch; for the factored GD step the discrepancy is the Taylor remainder O(lr^2) of
(K - lr G_K)^T (Q - lr G_Q), so halving lr must divide it by 4 (we accept 3..5; an O(lr)
discrepancy, as a wrong metric factor would give, divides by 2 and is rejected).
"""
import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from numerics.config import ProblemConfig
from numerics.config import make_generator, sample_prompts
from numerics.model import MultiHeadAttention, mse_loss
from numerics.model import metric_factors, reduced_loss, reduced_predict


def _values(cfg, seed):
    rng = np.random.default_rng(seed)
    omega = 0.4 * rng.normal(size=(cfg.heads, cfg.m))
    mu = rng.normal(size=(cfg.heads, cfg.m))
    return torch.tensor(omega), torch.tensor(mu)


@given(param=st.sampled_from(["factored", "merged"]), basis=st.sampled_from(["identity", "random"]),
       sigma=st.sampled_from([0.0, 0.5]), seed=st.integers(0, 1000))
def test_reduced_prediction_equals_full_model_on_D(param, basis, sigma, seed):
    cfg = ProblemConfig(tasks=(2, 1, 3), heads=2, L=11, sigma=sigma, param=param, basis=basis,
                        basis_seed=seed, logit_scale=2.0)
    omega, mu = _values(cfg, seed)
    p = sample_prompts(cfg, 8, make_generator(seed, "cpu"))
    full = MultiHeadAttention.from_semi_singular_values(cfg, omega, mu)(p.context, p.query)
    red = reduced_predict(omega, mu, p, cfg)
    assert torch.allclose(full, red, rtol=0, atol=1e-12)
    # the reduced model really depends on the block structure: swapping two tasks' omega differs
    assert not torch.allclose(reduced_predict(omega[:, [1, 0, 2]], mu, p, cfg), red, rtol=0, atol=1e-12)


@pytest.mark.parametrize("basis", ["identity", "random"])
def test_full_gradient_projected_on_D_equals_reduced_gradient(basis):
    """d L/d omega_i = <G_W, Phi_i Phi_i^T> = r_i * readout_omega(G_W), dL/dmu_i = (G_U)_{i, d+i},
    on the same (finite, unsymmetrised) batch, to float64 rounding."""
    cfg = ProblemConfig(tasks=(3, 1, 2), heads=3, L=16, sigma=0.3, param="merged", basis=basis, basis_seed=1)
    omega, mu = _values(cfg, 0)
    p = sample_prompts(cfg, 64, make_generator(1, "cpu"))
    model = MultiHeadAttention.from_semi_singular_values(cfg, omega, mu)
    mse_loss(model(p.context, p.query), p.target).backward()
    Phi, d = cfg.basis_numpy(), cfg.d
    GW, GU = model.W.grad.numpy(), model.U.grad.numpy()
    full_omega = np.stack([np.einsum("ai,hab,bi->h", Phi[:, sl], GW[:, :d, :d], Phi[:, sl])
                           for sl in cfg.block_slices], axis=1)
    full_mu = np.diagonal(GU[:, :, d:], axis1=1, axis2=2)
    om = omega.clone().requires_grad_(True)
    m_ = mu.clone().requires_grad_(True)
    reduced_loss(om, m_, p, cfg).backward()
    assert np.allclose(om.grad.numpy(), full_omega, rtol=0, atol=1e-12)
    assert np.allclose(m_.grad.numpy(), full_mu, rtol=0, atol=1e-12)
    # perturbed: forgetting the block trace (using the mean diagonal, i.e. a missing factor r_i)
    r = np.array(cfg.tasks)
    assert not np.allclose(om.grad.numpy(), full_omega / r, rtol=0, atol=1e-12)


def _step_mismatch(cfg, omega, mu, p, lr, factor_fn):
    """|readout after one full GD step - reduced Euler step with factor_fn's metric|."""
    model = MultiHeadAttention.from_semi_singular_values(cfg, omega, mu)
    loss = mse_loss(model(p.context, p.query), p.target)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    with torch.no_grad():
        for q, g in zip(model.parameters(), grads):
            q.sub_(lr * g)
    r = model.semi_singular_values()
    om = omega.clone().requires_grad_(True)
    m_ = mu.clone().requires_grad_(True)
    g_om, g_mu = torch.autograd.grad(reduced_loss(om, m_, p, cfg), [om, m_])
    f_om, f_mu = factor_fn(omega, mu, cfg)
    new_om = (omega - lr * f_om * g_om).numpy()
    new_mu = (mu - lr * f_mu * g_mu).numpy()
    return max(np.abs(r.omega - new_om).max(), np.abs(r.mu - new_mu).max())


def test_merged_gd_step_moves_values_by_the_merged_metric_exactly():
    """merged: the readout is linear in (W, U), so one step is exact (no lr^2 term)."""
    cfg = ProblemConfig(tasks=(2, 3), heads=2, L=12, param="merged", basis="random")
    omega, mu = _values(cfg, 3)
    p = sample_prompts(cfg, 32, make_generator(0, "cpu"))
    assert _step_mismatch(cfg, omega, mu, p, 0.1, metric_factors) < 1e-12
    wrong = lambda o, m, c: (torch.ones_like(o), torch.ones_like(m))  # noqa: E731  (no 1/r_i)
    assert _step_mismatch(cfg, omega, mu, p, 0.1, wrong) > 1e-6


@pytest.mark.parametrize("basis", ["identity", "random"])
def test_factored_gd_step_moves_values_by_the_balanced_metric(basis):
    """factored balanced: mismatch O(lr^2) (ratio ~4 when lr halves) with
    f_omega = 2|omega|/(s r_i), f_mu = 2|mu|; a wrong factor (no 2) leaves an O(lr) term."""
    cfg = ProblemConfig(tasks=(2, 3), heads=2, L=12, param="factored", basis=basis, logit_scale=1.5)
    omega, mu = _values(cfg, 5)          # signed values: the factors use |omega|, |mu|
    assert (omega < 0).any() and (mu < 0).any()
    p = sample_prompts(cfg, 32, make_generator(0, "cpu"))
    lr = 1e-3
    e1 = _step_mismatch(cfg, omega, mu, p, lr, metric_factors)
    e2 = _step_mismatch(cfg, omega, mu, p, lr / 2, metric_factors)
    assert 3.0 < e1 / e2 < 5.0, (e1, e2)
    half = lambda o, m, c: tuple(f / 2 for f in metric_factors(o, m, c))  # noqa: E731
    w1 = _step_mismatch(cfg, omega, mu, p, lr, half)
    w2 = _step_mismatch(cfg, omega, mu, p, lr / 2, half)
    assert not (3.0 < w1 / w2 < 5.0), (w1, w2)


def test_metric_factor_values_and_bad_input():
    cfg = ProblemConfig(tasks=(2, 4), heads=1, L=4, param="factored", logit_scale=2.0)
    omega, mu = torch.tensor([[0.5, -1.0]]), torch.tensor([[-3.0, 2.0]])
    f_om, f_mu = metric_factors(omega, mu, cfg)
    assert torch.allclose(f_om, torch.tensor([[2 * 0.5 / (2 * 2), 2 * 1.0 / (2 * 4)]]))
    assert torch.allclose(f_mu, torch.tensor([[6.0, 4.0]]))
    f_om, f_mu = metric_factors(omega, mu, cfg.replace(param="merged"))
    assert torch.allclose(f_om, torch.tensor([[0.5, 0.25]])) and torch.equal(f_mu, torch.ones(1, 2))
    p = sample_prompts(cfg, 2, make_generator(0, "cpu"))
    with pytest.raises(ValueError, match=r"omega must have shape \(heads, m\) = \(1, 2\)"):
        reduced_loss(torch.zeros(2, 2), torch.zeros(1, 2), p, cfg)
    with pytest.raises(TypeError, match="mu must be a torch.Tensor"):
        metric_factors(omega, [[1.0, 2.0]], cfg)
