"""The prompt sampler: shapes, seeding, exact linear structure, moments, symmetrisation.

Moment tolerances are Monte-Carlo arguments: a mean of N i.i.d. terms with standard deviation
sd is within 5 sd / sqrt(N) of its expectation except with probability < 1e-6 (the test is
seeded, so it is deterministic; the bound says the seed was not chosen to pass).  Each moment
check is also run against a perturbed prediction, which the same tolerance must reject.
"""
import numpy as np
import pytest
import torch

from numerics.config import ProblemConfig
from numerics.data import make_generator, sample_prompts, sign_flips


def _fit_task_matrix(prompts, cfg):
    """B (n, d, m) with y_l = B^T x_l exactly (least squares by the normal equations, x^T x
    ~ L I is well conditioned for L >> d; exact up to rounding when sigma = 0)."""
    x = prompts.context[..., :cfg.d]
    y = prompts.context[..., cfg.d:]
    return torch.linalg.solve(x.transpose(1, 2) @ x, x.transpose(1, 2) @ y)


def test_shapes_seeding_and_query_token():
    cfg = ProblemConfig(tasks=(2, 3), heads=1, L=7)
    p = sample_prompts(cfg, 5, make_generator(3, "cpu"))
    assert p.context.shape == (5, 7, 7) and p.query.shape == (5, 7) and p.target.shape == (5, 2)
    assert p.context.dtype == torch.float64 and p.batch == 5
    assert torch.all(p.query[:, cfg.d:] == 0)
    again = sample_prompts(cfg, 5, make_generator(3, "cpu"))
    assert torch.equal(p.context, again.context) and torch.equal(p.target, again.target)
    other = sample_prompts(cfg, 5, make_generator(4, "cpu"))
    assert not torch.equal(p.context, other.context)
    assert sample_prompts(cfg.replace(dtype="float32"), 2, make_generator(0, "cpu")).context.dtype == torch.float32


@pytest.mark.parametrize("basis", ["identity", "random"])
def test_labels_are_block_linear_in_the_task_basis(basis):
    """sigma = 0: y_l = B^T x_l and y_q = B^T q with Phi^T B block-diagonal (task i reads
    only its own block of basis coordinates)."""
    cfg = ProblemConfig(tasks=(2, 3, 1), heads=1, L=40, basis=basis, basis_seed=5)
    p = sample_prompts(cfg, 16, make_generator(0, "cpu"))
    B = _fit_task_matrix(p, cfg)
    resid = torch.bmm(p.context[..., :cfg.d], B) - p.context[..., cfg.d:]
    assert resid.abs().max() < 1e-12
    assert torch.allclose(torch.bmm(p.query[:, None, :cfg.d], B)[:, 0], p.target, atol=1e-12)
    G = cfg.basis_matrix().T @ B                           # (n, d, m): g_i in block i, column i
    off_block = G * (1 - cfg.task_indicator())[None]
    assert off_block.abs().max() < 1e-10


def test_moments_of_task_parameters_and_noise():
    """E|g_i|^2 = r_i; y - B^T x = sigma eps with eps i.i.d. N(0, 1): variance sigma^2,
    no correlation across tasks; the same seed with sigma = 0 gives the same x, q, g."""
    sigma, n, L = 0.5, 400, 64
    cfg0 = ProblemConfig(tasks=(2, 4), heads=1, L=L)
    cfg = cfg0.replace(sigma=sigma)
    p0 = sample_prompts(cfg0, n, make_generator(11, "cpu"))
    p = sample_prompts(cfg, n, make_generator(11, "cpu"))
    assert torch.equal(p.query, p0.query) and torch.equal(p.target, p0.target)

    # |g_i|^2 ~ chi^2_{r_i}: mean r_i, sd sqrt(2 r_i)
    B = _fit_task_matrix(p0, cfg0)
    g2 = (B ** 2).sum(dim=1)                                # (n, m): |g_i|^2
    r = torch.tensor(cfg.tasks, dtype=torch.float64)
    tol = 5 * torch.sqrt(2 * r / n)
    assert torch.all((g2.mean(0) - r).abs() < tol), (g2.mean(0), r, tol)
    assert torch.all((g2.mean(0) - (r + 1)).abs() > tol)     # perturbed: r_i + 1 is rejected

    # noise: e = y_sigma - y_0 = sigma eps; var(e) = sigma^2 with sd of the estimate
    # sigma^2 sqrt(2/N); covariance across tasks 0 with sd sigma^2 / sqrt(N)
    e = (p.context[..., cfg.d:] - p0.context[..., cfg.d:]).reshape(-1, cfg.m)
    N = e.shape[0]
    var = (e ** 2).mean(0)
    tol_var = 5 * sigma ** 2 * np.sqrt(2 / N)
    assert torch.all((var - sigma ** 2).abs() < tol_var)
    assert torch.all((var - 1.1 * sigma ** 2).abs() > tol_var)   # perturbed: 10% more noise rejected
    assert abs(float((e[:, 0] * e[:, 1]).mean())) < 5 * sigma ** 2 / np.sqrt(N)
    assert abs(float(e.mean())) < 5 * sigma / np.sqrt(e.numel())


def test_conditional_second_moment_of_labels():
    """E[y_l y_l^T | g] = diag(|g_i|^2) + sigma^2 I (block structure: tasks uncorrelated given
    g).  Per entry (i, j) the mean over N = n L tokens of y_i y_j / sqrt(|g_i|^2 + s^2)(|g_j|^2 + s^2)
    has sd <= sqrt(2)/sqrt(N) (Gaussian fourth moments: Var(y_i y_j) = S_ii S_jj + S_ij^2)."""
    sigma, n, L = 0.7, 64, 256
    cfg = ProblemConfig(tasks=(3, 2), heads=1, L=L, sigma=sigma, basis="random", basis_seed=2)
    p = sample_prompts(cfg, n, make_generator(5, "cpu"))
    p0 = sample_prompts(cfg.replace(sigma=0.0), n, make_generator(5, "cpu"))
    g2 = (_fit_task_matrix(p0, cfg) ** 2).sum(dim=1)                   # (n, m)
    S = g2 + sigma ** 2                                                 # predicted diagonal
    y = p.context[..., cfg.d:]                                          # (n, L, m)
    scale = torch.sqrt(S[:, :, None] * S[:, None, :])                   # (n, m, m)
    emp = torch.einsum("nli,nlj->nij", y, y) / L / scale                # normalised moments
    pred = torch.eye(cfg.m, dtype=torch.float64).expand(n, -1, -1)
    tol = 5 * np.sqrt(2 / (n * L))
    assert (emp - pred).mean(0).abs().max() < tol
    wrong = (g2 + 2 * sigma ** 2)[:, :, None] * torch.eye(cfg.m) / scale    # noise counted twice
    assert (emp - wrong).mean(0).abs().max() > tol


def test_symmetrized_batch_is_the_sign_flip_orbit():
    cfg = ProblemConfig(tasks=(2, 1), heads=1, L=5, sigma=0.3)
    p = sample_prompts(cfg, 12, make_generator(0, "cpu"), symmetrize=True)
    n, d = 3, cfg.d
    s = sign_flips(cfg.m)
    assert torch.equal(s[0], torch.ones(cfg.m, dtype=torch.float64))
    for k in range(4):
        img = slice(k * n, (k + 1) * n)
        assert torch.equal(p.context[img, :, :d], p.context[:n, :, :d])
        assert torch.equal(p.query[img], p.query[:n])
        assert torch.equal(p.context[img, :, d:], s[k] * p.context[:n, :, d:])
        assert torch.equal(p.target[img], s[k] * p.target[:n])
    # over the orbit every y-odd statistic vanishes exactly
    assert p.context[..., d:].sum(0).abs().max() < 1e-12
    assert (p.context[:, :, d] * p.context[:, :, d + 1]).sum(0).abs().max() < 1e-12


def test_bad_sampler_input():
    cfg = ProblemConfig(tasks=(2, 1), heads=1, L=5)
    gen = make_generator(0, "cpu")
    with pytest.raises(ValueError, match="multiple of 4"):
        sample_prompts(cfg, 6, gen, symmetrize=True)
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        sample_prompts(cfg, 0, gen)
    with pytest.raises(ValueError, match="seed must be an integer >= 0"):
        make_generator(-1, "cpu")
    with pytest.raises(ValueError, match="unknown device|not supported"):
        make_generator(0, "tpu")
