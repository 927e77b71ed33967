"""The full model: agreement with PyTorch's scaled_dot_product_attention, the decomposable
constructor and readout, the residual, the saturation regime, bad input.

Agreement tolerances are float64 rounding: sums of O(L (d+m)) products of O(1) numbers,
relative error ~ 1e-16 x a few hundred, so 1e-12 absolute on O(1) outputs.
"""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from numerics.config import ProblemConfig
from numerics.config import make_generator, sample_prompts
from numerics.model import MultiHeadAttention, TrainingDiverged, initial_semi_singular_values, mse_loss
from theory.reduced_ode import decomposable_weights

F = torch.nn.functional


def sdpa_reference(model, context, query):
    """Independent implementation: per-token projections of every context token fed to
    torch.nn.functional.scaled_dot_product_attention, one head at a time."""
    cfg = model.cfg
    out = 0
    for h in range(cfg.heads):
        if cfg.param == "factored":
            qh = query[:, None, :] @ model.Q[h].T           # (B, 1, D): Q_h z_q
            kh = context @ model.K[h].T                     # (B, L, D): K_h z_l
            vh = context @ model.V[h].T                     # (B, L, D): V_h z_l
            att = F.scaled_dot_product_attention(qh, kh, vh, scale=1.0 / cfg.logit_scale)
            out = out + att[:, 0] @ model.O[h].T
        else:
            qh = query[:, None, :] @ model.W[h].T           # z_l^T W_h z_q = <z_l, W_h z_q>
            att = F.scaled_dot_product_attention(qh, context, context, scale=1.0)
            out = out + att[:, 0] @ model.U[h].T
    return out


@given(tasks=st.lists(st.integers(1, 3), min_size=1, max_size=3), heads=st.integers(1, 3),
       param=st.sampled_from(["factored", "merged"]), basis=st.sampled_from(["identity", "random"]),
       logit_scale=st.sampled_from([1.0, 2.5]), seed=st.integers(0, 100))
def test_forward_agrees_with_scaled_dot_product_attention(tasks, heads, param, basis, logit_scale, seed):
    cfg = ProblemConfig(tasks=tuple(tasks), heads=heads, L=9, param=param, basis=basis,
                        logit_scale=logit_scale, init="random_full", init_scale=1.0, init_seed=seed)
    model = MultiHeadAttention(cfg)
    p = sample_prompts(cfg, 6, make_generator(seed, "cpu"))
    # a general query token (nonzero y part) would be ignored by our a_h = W[:, :d] q; the
    # sampler's z_q = (q, 0) is the only input the model is defined for
    ours = model(p.context, p.query)
    ref = sdpa_reference(model, p.context, p.query)
    assert ours.shape == (6, cfg.m)
    assert torch.allclose(ours, ref, rtol=0, atol=1e-12), (ours - ref).abs().max()
    # a wrong logit scale must be detected at this tolerance (only meaningful for factored)
    if param == "factored":
        wrong = MultiHeadAttention(cfg.replace(logit_scale=logit_scale * 1.01))
        wrong.load_state_dict(model.state_dict())
        assert not torch.allclose(wrong(p.context, p.query), ref, rtol=0, atol=1e-12)


@given(param=st.sampled_from(["factored", "merged"]), basis=st.sampled_from(["identity", "random"]),
       seed=st.integers(0, 1000))
def test_constructor_readout_round_trip_and_zero_residual(param, basis, seed):
    cfg = ProblemConfig(tasks=(2, 3, 1), heads=2, L=4, param=param, basis=basis, basis_seed=seed,
                        logit_scale=1.7)
    rng = np.random.default_rng(seed)
    omega, mu = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))     # signed values
    model = MultiHeadAttention.from_semi_singular_values(cfg, omega, mu)
    r = model.semi_singular_values()
    assert np.allclose(r.omega, omega, atol=1e-12) and np.allclose(r.mu, mu, atol=1e-12)
    assert r.residual < 1e-13
    W, U = (t.detach().numpy() for t in model.merged_weights())
    W_ref, U_ref = decomposable_weights(omega, mu, cfg.tasks, cfg.basis_numpy())
    assert np.allclose(W, W_ref, atol=1e-12) and np.allclose(U, U_ref, atol=1e-12)
    if param == "factored":
        # balanced: K^T K = Q^T Q (K = Q up to per-task signs on X), O = V^T up to signs on Y
        d = cfg.d
        assert torch.allclose(model.O[:, :, d:].abs(), model.V[:, d:, d:].transpose(1, 2).abs(), atol=1e-12)
        KtK = model.K.transpose(1, 2) @ model.K
        QtQ = model.Q.transpose(1, 2) @ model.Q
        assert torch.allclose(KtK, QtQ, atol=1e-12)     # balancedness, basis-independent


def test_residual_is_exact_off_the_decomposable_set():
    cfg = ProblemConfig(tasks=(2, 2), heads=2, L=4, param="merged")
    model = MultiHeadAttention(cfg)                      # default init, a point of D
    W, U = (t.detach() for t in model.merged_weights())
    norm2 = float((W ** 2).sum() + (U ** 2).sum())
    delta = 1e-3
    with torch.no_grad():
        model.W[0, 0, cfg.d] += delta                   # an X-Y entry: orthogonal to D
    r = model.semi_singular_values()
    assert math.isclose(r.residual, delta / math.sqrt(norm2 + delta ** 2), rel_tol=1e-10)
    assert not math.isclose(r.residual, 2 * delta / math.sqrt(norm2), rel_tol=1e-3)
    # an off-diagonal entry inside one task's X-X block is off D too
    with torch.no_grad():
        model.W[0, 0, cfg.d] -= delta
        model.W[1, 0, 1] += delta
    assert math.isclose(model.semi_singular_values().residual, delta / math.sqrt(norm2 + delta ** 2), rel_tol=1e-10)
    # a generic start is far from D
    full = MultiHeadAttention(cfg.replace(init="random_full", param="factored"))
    assert full.semi_singular_values().residual > 0.5


def test_initialisation_patterns():
    cfg = ProblemConfig(tasks=(1, 2), heads=3, L=4, init_scale=0.2)
    omega, mu = initial_semi_singular_values(cfg)
    assert torch.equal(omega, torch.full((3, 2), 0.2, dtype=torch.float64))
    assert torch.allclose(mu, torch.tensor([[0.4, 0.2], [0.2, 0.4], [0.4, 0.2]], dtype=torch.float64))
    r = MultiHeadAttention(cfg).semi_singular_values()
    assert np.allclose(r.omega, 0.2) and np.allclose(r.mu, mu.numpy()) and r.residual < 1e-14
    rd = initial_semi_singular_values(cfg.replace(init="random_decomposable", init_seed=4))
    assert all(((0.1 <= t) & (t <= 0.3)).all() for t in rd)
    assert not torch.equal(rd[0], initial_semi_singular_values(cfg.replace(init="random_decomposable"))[0])
    given_cfg = cfg.replace(init="given", init_omega=((1, 2), (3, 4), (5, 6)), init_mu=((0, 1), (1, 0), (-1, 2)))
    r = MultiHeadAttention(given_cfg).semi_singular_values()
    assert np.allclose(r.omega, [[1, 2], [3, 4], [5, 6]]) and np.allclose(r.mu, [[0, 1], [1, 0], [-1, 2]])
    a = MultiHeadAttention(cfg.replace(init="random_full", init_seed=1))
    b = MultiHeadAttention(cfg.replace(init="random_full", init_seed=1))
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    with pytest.raises(ValueError, match="not a point of the decomposable set"):
        initial_semi_singular_values(cfg.replace(init="random_full"))


@pytest.mark.parametrize("param", ["factored", "merged"])
def test_saturated_logits_do_not_overflow(param):
    """Logits of order 1e4 (far beyond exp's float64 range of ~709): the softmax must tend to
    the argmax, so the prediction is U_h applied to the token with the largest logit."""
    cfg = ProblemConfig(tasks=(2, 2), heads=1, L=16, param=param)
    omega, mu = np.array([[500.0, 500.0]]), np.array([[1.0, -2.0]])
    model = MultiHeadAttention.from_semi_singular_values(cfg, omega, mu)
    p = sample_prompts(cfg, 32, make_generator(0, "cpu"))
    pred = model(p.context, p.query)
    assert torch.isfinite(pred).all()
    logits = (torch.einsum("bld,bd->bl", p.context[..., :cfg.d], p.query[:, :cfg.d]) * 500.0).numpy()
    assert np.abs(logits).max() > 1e3
    # reference: softmax in numpy by the log-sum-exp identity (naive exp would overflow here);
    # logits ~1e4 are computed along two routes with rounding ~1e4 * 1e-16 each, so the weights
    # agree to ~1e-11 relative: 1e-9 absolute on O(1) outputs is rounding, with margin
    w = np.exp(logits - logits.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    y = p.context[..., cfg.d:].numpy()
    ref = np.einsum("bl,bli->bi", w, y) * np.array([1.0, -2.0])
    assert np.allclose(pred.detach().numpy(), ref, rtol=0, atol=1e-9)
    # where the top logit leads by > 40 (other weights < e^-40 L), that is the argmax token
    top2 = np.sort(logits, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 40
    assert clear.sum() > 10
    y_top = y[np.arange(32), logits.argmax(axis=1)] * np.array([1.0, -2.0])
    assert np.allclose(pred.detach().numpy()[clear], y_top[clear], rtol=0, atol=1e-12)
    loss = mse_loss(pred, p.target)
    loss.backward()
    assert all(torch.isfinite(t.grad).all() for t in model.parameters())


def test_from_weights_copies_the_given_matrices():
    cfg = ProblemConfig(tasks=(2, 1), heads=2, L=4, param="merged")
    gen = torch.Generator().manual_seed(0)
    W = torch.randn(2, 5, 5, generator=gen, dtype=torch.float64)
    U = torch.randn(2, 2, 5, generator=gen, dtype=torch.float64)
    model = MultiHeadAttention.from_weights(cfg, W=W, U=U)
    assert torch.equal(model.W, W) and torch.equal(model.U, U)
    fac = MultiHeadAttention.from_weights(cfg.replace(param="factored", logit_scale=2.0),
                                          K=W, Q=W, V=W, O=U)
    Wm, Um = fac.merged_weights()
    assert torch.allclose(Wm, W.transpose(1, 2) @ W / 2.0) and torch.allclose(Um, U @ W)
    with pytest.raises(ValueError, match=r"needs exactly the weights \['U', 'W'\]"):
        MultiHeadAttention.from_weights(cfg, W=W)
    with pytest.raises(ValueError, match=r"U must have shape \(2, 2, 5\)"):
        MultiHeadAttention.from_weights(cfg, W=W, U=U[:, :1])
    with pytest.raises(ValueError, match="W must be finite"):
        MultiHeadAttention.from_weights(cfg, W=W * float("nan"), U=U)


def test_bad_model_input():
    cfg = ProblemConfig(tasks=(2, 1), heads=2, L=4)
    model = MultiHeadAttention(cfg)
    p = sample_prompts(cfg, 3, make_generator(0, "cpu"))
    with pytest.raises(ValueError, match=r"context must have shape \(B, L, d\+m\) = \(B, L, 5\)"):
        model(p.context[..., :4], p.query)
    with pytest.raises(ValueError, match=r"query must have shape \(B, d\+m\) = \(3, 5\)"):
        model(p.context, p.query[:2])
    with pytest.raises(ValueError, match=r"omega must have shape \(heads, m\) = \(2, 2\)"):
        MultiHeadAttention.from_semi_singular_values(cfg, np.ones((2, 3)), np.ones((2, 2)))
    with pytest.raises(ValueError, match="mu must be finite"):
        MultiHeadAttention.from_semi_singular_values(cfg, np.ones((2, 2)), np.full((2, 2), np.nan))
    with pytest.raises(ValueError, match="same shape"):
        mse_loss(torch.zeros(3, 2), torch.zeros(3, 1))
    with torch.no_grad():
        model.K[0, 0, 0] = float("nan")
    with pytest.raises(TrainingDiverged, match="NaN or inf"):
        model.semi_singular_values()
