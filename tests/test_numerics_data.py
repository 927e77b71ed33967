"""The prompt sampler: shapes, seeding, exact linear structure, moments, symmetrisation.

Moment tolerances are Monte-Carlo arguments: a mean of N i.i.d. terms with standard deviation
sd is within 5 sd / sqrt(N) of its expectation except with probability < 1e-6 (the test is
seeded, so it is deterministic; the bound says the seed was not chosen to pass).  Each moment
check is also run against a perturbed prediction, which the same tolerance must reject.
"""
import numpy as np
import pytest
import torch

import numerics.data as data
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


# --- the keyed, chunked stream (STREAM_VERSION 2) ------------------------------------------------



def test_same_numbers_for_any_thread_count():
    """Counter-based chunks: 1, 2 or 3 threads draw bit-identical batches (the batch of
    1000 has 4 chunks, the last one partial)."""
    cfg = ProblemConfig(tasks=(2, 3), heads=1, L=6, sigma=0.4, basis="random", basis_seed=1)
    n = 3 * data.CHUNK_PROMPTS + 232
    runs = [sample_prompts(cfg, n, make_generator(9, "cpu"), threads=t) for t in (1, 2, 3)]
    for other in runs[1:]:
        assert torch.equal(runs[0].context, other.context)
        assert torch.equal(runs[0].query, other.query) and torch.equal(runs[0].target, other.target)
    # the chunks are distinct draws (not one chunk repeated)
    c = data.CHUNK_PROMPTS
    assert not torch.equal(runs[0].context[:c], runs[0].context[c:2 * c])


def test_one_call_advances_the_generator_by_one_key():
    """Whatever the batch, sigma or symmetrisation, a call advances the caller's generator by
    one 64-bit draw, so a saved generator state resumes the stream bit-identically."""
    cfg = ProblemConfig(tasks=(2, 1), heads=1, L=5)
    for batch, sigma, sym in ((8, 0.0, False), (700, 0.3, False), (16, 0.3, True)):
        gen, ref = make_generator(4, "cpu"), make_generator(4, "cpu")
        sample_prompts(cfg.replace(sigma=sigma), batch, gen, symmetrize=sym)
        torch.randint(0, 2 ** 63 - 1, (), generator=ref, dtype=torch.int64)
        assert torch.equal(gen.get_state(), ref.get_state())
    gen = make_generator(4, "cpu")
    first = sample_prompts(cfg, 300, gen)
    saved = gen.get_state()
    second = sample_prompts(cfg, 300, gen)
    resumed = torch.Generator()
    resumed.set_state(saved)
    assert torch.equal(sample_prompts(cfg, 300, resumed).context, second.context)
    assert not torch.equal(first.context, second.context)      # each call is a fresh batch


def test_common_random_numbers_across_sigma_and_batch_prefix():
    """Runs that differ only in sigma share x, q, g at every call (the noise has its own
    sub-stream and is skipped at sigma = 0), and a batch's first prompts do not depend on the
    batch size (in whole chunks); float32 and float64 see the same draws."""
    cfg0 = ProblemConfig(tasks=(2, 2), heads=1, L=4)
    cfg = cfg0.replace(sigma=0.8)
    n, d = data.CHUNK_PROMPTS + 50, cfg0.d
    g0, g1 = make_generator(2, "cpu"), make_generator(2, "cpu")
    for _ in range(2):                                      # two steps: the state stays in step
        p0, p1 = sample_prompts(cfg0, n, g0), sample_prompts(cfg, n, g1)
        assert torch.equal(p0.context[..., :d], p1.context[..., :d])
        assert torch.equal(p0.query, p1.query) and torch.equal(p0.target, p1.target)
        assert not torch.equal(p0.context[..., d:], p1.context[..., d:])
    big = sample_prompts(cfg, 2 * n, make_generator(2, "cpu"))
    small = sample_prompts(cfg, n, make_generator(2, "cpu"))
    c = data.CHUNK_PROMPTS                  # whole chunks are shared; a partial chunk is not a prefix
    assert torch.equal(big.context[:c], small.context[:c]) and torch.equal(big.target[:c], small.target[:c])
    p32 = sample_prompts(cfg0.replace(dtype="float32"), n, make_generator(2, "cpu"))
    first64 = sample_prompts(cfg0, n, make_generator(2, "cpu"))
    assert torch.equal(p32.context[..., :d].double(), first64.context[..., :d])
    assert torch.equal(p32.query.double(), first64.query)


def test_chunk_generators_use_the_whole_64_bit_seed():
    """torch's manual_seed keeps 32 bits of a seed; the chunk generators are built from the
    full 64-bit seed (their whole mt19937 state), so seeds equal in their low 32 bits still
    give different streams.  The state layout is the one torch's manual_seed writes."""
    data._check_state_layout()                   # raises if torch changed its state layout
    key = 123456789
    a = data._chunk_generator(key, 0, 0)
    gens = [data._mt_generator(data._splitmix64_words(s, 312).view(np.uint32).astype(np.uint64))
            for s in (5, 5 + 2 ** 32)]
    draws = [torch.randn(32, generator=g) for g in gens]
    assert not torch.equal(draws[0], draws[1])
    assert not torch.equal(torch.randn(32, generator=a), torch.randn(32, generator=data._chunk_generator(key, 0, 1)))
    seeds = {data.chunk_seed(k, c, s) for k in range(50) for c in range(20) for s in (0, 1)}
    assert len(seeds) == 50 * 20 * 2


def test_chunks_are_independent_standard_normals():
    """Across chunk boundaries the x draws have mean 0, variance 1 and no correlation between
    prompt p of chunk 0 and prompt p of chunk 1 (each within 5 sd / sqrt(N) of the prediction;
    a correlation of 0.2, the perturbed prediction, is rejected)."""
    cfg = ProblemConfig(tasks=(3,), heads=1, L=32)
    c = data.CHUNK_PROMPTS
    x = sample_prompts(cfg, 2 * c, make_generator(0, "cpu")).context[..., :cfg.d]
    a, b = x[:c].reshape(-1), x[c:].reshape(-1)
    N = a.numel()
    tol = 5 / np.sqrt(N)
    corr = float((a * b).mean())
    assert abs(corr) < tol and abs(corr - 0.2) > tol
    assert abs(float(x.mean())) < 5 / np.sqrt(x.numel())
    assert abs(float((x ** 2).mean()) - 1) < 5 * np.sqrt(2 / x.numel())


def test_device_stream_draws_noise_whatever_sigma():
    """The CUDA path (run here with a CPU generator): one sequential stream x, q, g, eps, eps
    drawn even at sigma = 0, so the generator and x, q, g do not depend on sigma."""
    cfg0 = ProblemConfig(tasks=(2, 1), heads=1, L=5)
    g0, g1 = make_generator(3, "cpu"), make_generator(3, "cpu")
    a = data._prompts_from_draws(cfg0, *data._draw_on_device(cfg0, 40, g0))
    b = data._prompts_from_draws(cfg0.replace(sigma=0.5), *data._draw_on_device(cfg0.replace(sigma=0.5), 40, g1))
    assert torch.equal(g0.get_state(), g1.get_state())
    assert torch.equal(a[0][..., :cfg0.d], b[0][..., :cfg0.d]) and torch.equal(a[2], b[2])
    assert not torch.equal(a[0], b[0])
    B = torch.linalg.solve(a[0][..., :cfg0.d].transpose(1, 2) @ a[0][..., :cfg0.d],
                           a[0][..., :cfg0.d].transpose(1, 2) @ a[0][..., cfg0.d:])
    assert torch.allclose(torch.bmm(a[1][:, None, :cfg0.d], B)[:, 0], a[2], atol=1e-12)


def test_bad_thread_count_and_generator():
    cfg = ProblemConfig(tasks=(2, 1), heads=1, L=5)
    with pytest.raises(ValueError, match="threads must be a positive integer"):
        sample_prompts(cfg, 4, make_generator(0, "cpu"), threads=0)
    with pytest.raises(TypeError, match="must be a torch.Generator"):
        sample_prompts(cfg, 4, 0)
