"""Claim 7 (theory side): the best decomposable attention versus the allocated limit."""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from theory import reduced_ode as ro
from theory.limiting_error import limit_multi
from theory.optimality import best_decomposable_attention, linear_attention_limit, optimality_ratio


def test_linear_attention_limit_by_monte_carlo():
    """r (r + 1 + sigma^2) per token: E|x x^T g + x eps - g|^2 over x, g, eps (numpy MC,
    400k samples: relative standard error ~0.5%, tolerance 4 standard errors); a wrong
    constant r(r + sigma^2) (no fourth-moment term) is rejected."""
    rng = np.random.default_rng(0)
    r, sigma, n = 3, 0.5, 400_000
    x, g = rng.standard_normal((n, r)), rng.standard_normal((n, r))
    eps = sigma * rng.standard_normal(n)
    v = x * ((x * g).sum(1) + eps)[:, None] - g
    sq = (v ** 2).sum(1)
    mean, se = sq.mean(), sq.std() / np.sqrt(n)
    assert abs(mean - linear_attention_limit((r,), sigma)) < 4 * se
    assert abs(mean - r * (r + sigma ** 2)) > 4 * se


def test_profile_mu_is_the_exact_minimiser():
    rng = np.random.default_rng(1)
    om = rng.uniform(-0.3, 0.3, (3, 2))
    mu, val, ok = ro.profile_mu(om, (2, 3), 200.0, 0.1)
    assert ok and abs(ro.expansion_loss(om, mu, (2, 3), 200.0, 0.1) - val) < 1e-10
    _, g_mu = ro.expansion_gradient(om, mu, (2, 3), 200.0, 0.1)
    assert np.max(np.abs(g_mu)) < 1e-8


def test_best_attention_beats_allocation_and_reaches_linear_attention():
    """H = m + 1 heads can cancel the softmax's constant part and all cross-task terms, so
    the search reaches the linear-attention limit r(r+1+sigma^2)/L up to its O(1/L)
    relative correction (r/L ~ 0.3% here; tolerance 2%); the allocated point is worse by
    about limit_multi / linear_attention_limit.  A wrong claim "allocation is optimal"
    (ratio 1 within 2%) is rejected."""
    tasks, L = (3, 3), 1000.0
    best = best_decomposable_attention(tasks, 3, L, starts=3)
    assert best.at_small_omega
    assert abs(L * best.loss / linear_attention_limit(tasks) - 1) < 0.02
    res = optimality_ratio(tasks, 2, L, starts=3)
    assert res["best_loss_at_L"] < res["allocated_loss_at_L"]
    assert abs(res["ratio_at_L"] - 1) > 0.02
    assert abs(res["ratio_limit"] - limit_multi(tasks) / linear_attention_limit(tasks)) < 1e-12


def test_constant_tends_to_e():
    """limit_multi / linear_attention_limit -> e as r grows (allocated ~ e r(r + sigma^2))."""
    vals = [limit_multi((r,)) / linear_attention_limit((r,)) for r in (10, 100, 1000, 10_000)]
    assert all(a > b for a, b in zip(vals, vals[1:]))
    assert abs(vals[-1] - np.e) < 1e-3 and abs(vals[-1] - 3.0) > 0.1


def test_bad_input():
    with pytest.raises(ValueError, match="one head per task"):
        optimality_ratio((2, 2, 2), 2, 100)
    with pytest.raises(ValueError, match="heads"):
        best_decomposable_attention((2,), 0, 100)


# --- claim 7 at equal heads (issue 12): theory-against-theory checks moved out of the claim ---

from theory import exact
from theory.optimality import (constant_bracket, linear_attention_loss, linear_attention_point,
                               linear_attention_scale, reaches_linear_attention)


def test_linear_attention_loss_by_monte_carlo():
    """Centred linear attention at its optimal scale, numpy Monte Carlo over whole prompts
    (r = 2, L = 8, sigma = 0.5: 200k prompts, tolerance 4 standard errors); the uncentred
    formula r(r+1+s^2)/(L+r+1+s^2) is rejected at the same tolerance."""
    rng = np.random.default_rng(3)
    r, L, sigma, n = 2, 8, 0.5, 200_000
    x = rng.standard_normal((n, L, r))
    g = rng.standard_normal((n, r))
    q = rng.standard_normal((n, r))
    y = np.einsum("nlr,nr->nl", x, g) + sigma * rng.standard_normal((n, L))
    xc = x - x.mean(axis=1, keepdims=True)
    a = 1.0 / (L - 1 + r + 1 + sigma ** 2)
    pred = a * np.einsum("nl,nlr,nr->n", y, xc, q)
    sq = (pred - (g * q).sum(1)) ** 2
    mean, se = sq.mean(), sq.std() / np.sqrt(n)
    assert abs(mean - linear_attention_loss((r,), L, sigma)) < 4 * se
    assert abs(mean - r * (r + 1 + sigma ** 2) / (L + r + 1 + sigma ** 2)) > 4 * se
    assert abs(linear_attention_scale((r,), L, sigma)[0] - L * a) < 1e-12


@pytest.mark.parametrize("L", [64, 256])
def test_construction_reaches_linear_attention_exactly(L):
    """The (m+1)-head construction at omega = 1e-3, on theory.exact's quadrature (two heads,
    one task), has the closed-form centred linear-attention loss within its O(omega^2)
    (relative 1e-5 allowed; measured 5e-7)."""
    tasks, sigma = (3,), 0.5
    om, mu = linear_attention_point(tasks, 2, 1e-3, linear_attention_scale(tasks, L, sigma))
    e = exact.exact_loss(om, mu, tasks, L, sigma)
    assert abs(e.loss / linear_attention_loss(tasks, L, sigma) - 1) < 1e-5
    assert abs(10 ** 9 * linear_attention_loss(tasks, 10 ** 9, sigma) - linear_attention_limit(tasks, sigma)) < 1e-6


def test_equal_heads_cannot_reach_linear_attention():
    """The rank argument: zero-sum columns of M (1^T M = 0) give rank(M^T Omega) <= H - 1, so
    M^T Omega = c I_m is impossible for H = m and possible (the construction) for H = m + 1."""
    rng = np.random.default_rng(5)
    for m in (1, 2, 3, 5):
        M = rng.standard_normal((m, m))
        M -= M.mean(axis=0, keepdims=True)
        assert np.linalg.matrix_rank(M.T @ rng.standard_normal((m, m))) <= m - 1
        assert not reaches_linear_attention((2,) * m, m) and reaches_linear_attention((2,) * m, m + 1)
        om, mu = linear_attention_point((2,) * m, m + 1, 0.1)
        assert np.allclose(mu.sum(axis=0), 0) and np.allclose(mu.T @ om, np.eye(m))
    with pytest.raises(ValueError, match="heads >= m \\+ 1"):
        linear_attention_point((2, 2), 2)


def test_constant_bracket_shape():
    """H = m: [1, allocated/linear] with the upper edge > 1; H = m + 1: closed at allocated/linear;
    allocated from the quadrature fixed point, linear from the closed form."""
    b_m = constant_bracket((2, 2), 2, 64)
    b_m1 = constant_bracket((2, 2), 3, 64)
    assert b_m["low"] == 1.0 and b_m["high"] > 2.0 and not b_m["reaches_linear"]
    assert b_m1["low"] == b_m1["high"] == b_m["high"] and b_m1["reaches_linear"]
    assert abs(b_m["allocated"] - exact.exact_fixed_point((2, 2), 64)["loss"]) < 1e-12
    assert abs(b_m["linear"] - 2 * 2 * 3 / (64 + 2)) < 1e-12


def test_constant_bounded_in_r_richardson():
    """(Was claim 7's check_constant_bounded, a theory-against-theory comparison.)  C_inf(r) =
    limit_multi / linear_attention_limit is finite for r = 1..10^4 and its Richardson
    extrapolation of the last two values is e within the next order left in it; a constant
    growing like log r is rejected at the same tolerance."""
    rs = np.array([1, 2, 4, 10, 40, 100, 1000, 10000], float)
    vals = np.array([limit_multi((int(r),)) / linear_attention_limit((int(r),)) for r in rs])
    assert np.all(np.isfinite(vals)) and vals.max() < 4.3
    extrapolated = (rs[-1] * vals[-1] - rs[-2] * vals[-2]) / (rs[-1] - rs[-2])
    tol = abs(vals[-1] - vals[-2]) * rs[-2] / rs[-1]
    assert abs(extrapolated - np.e) <= tol
    assert abs(vals[-1] - (vals[0] + np.log(rs[-1] / rs[0]))) > tol


# --- the search gives one answer on every BLAS kernel and SIMD path this CPU runs ---

ROOT = Path(__file__).resolve().parents[1]
# the cases on which the unregularised search returned negative losses (-0.040 under the Haswell/Zen
# kernels, -0.117 under SkylakeX) where others gave +0.0596 and +0.0592; the full case of the report
CHEAP = (((2, 2), 3, 200.0), ((2,), 2, 100.0))
FULL = (((3, 3), 3, 1000.0), ((3, 3), 2, 1000.0))
CORE_NEEDS = {"Haswell": {"avx2", "fma"}, "Zen": {"avx2", "fma"}, "Sandybridge": {"avx"}, "Nehalem": {"sse4_2"},
              "Prescott": {"pni"}, "SkylakeX": {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}}
SIMD_OFF = "numpy SIMD paths off"
CHILD = r"""
import ctypes, glob, json, os, sys
import numpy
from theory.optimality import best_decomposable_attention

def corename():
    for lib in glob.glob(os.path.join(os.path.dirname(numpy.__file__), "..", "numpy.libs", "*openblas*.so*")):
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
            f = getattr(ctypes.CDLL(lib), name, None)
            if f is not None:
                f.restype = ctypes.c_char_p
                return f().decode()
    return None

cases, starts = json.loads(sys.argv[1]), int(sys.argv[2])
runs = [best_decomposable_attention(tuple(t), H, L, starts=starts) for t, H, L in cases]
print(json.dumps({"core": corename(), "loss": [b.loss for b in runs], "small": [b.at_small_omega for b in runs]}))
"""


def _cpu_flags():
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))


def _optional_simd() -> list:
    """numpy's dispatched SIMD targets this CPU has (its baseline cannot be switched off)."""
    from numpy._core import _multiarray_umath as um
    return [f for f in um.__cpu_dispatch__ if um.__cpu_features__.get(f)]


@functools.lru_cache(maxsize=None)
def _search(cases, starts, setting):
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES")}
    env.update(PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    if setting == SIMD_OFF:
        env["NPY_DISABLE_CPU_FEATURES"] = " ".join(_optional_simd())
    elif setting:
        env["OPENBLAS_CORETYPE"] = setting
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(cases), str(starts)], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, f"{setting or 'default kernel'}: {proc.stderr[-2000:]}"
    return json.loads(proc.stdout)


def _same_answer(setting, cases, starts):
    """The search under ``setting`` against the default kernel, case by case: the same loss within
    optimality.search_rtol(H) (the rounding bound H^3 u / RIDGE of the regularised profile, fixed
    by the method, not by these runs), and the same verdict on the run to omega -> 0."""
    from theory.optimality import search_rtol
    if setting == SIMD_OFF and not _optional_simd():
        pytest.skip("numpy has no optional SIMD path on this CPU")
    flags = _cpu_flags()
    if setting in CORE_NEEDS and (flags is None or not CORE_NEEDS[setting] <= flags):
        pytest.skip(f"this CPU cannot run OpenBLAS's {setting} kernels")
    ref, got = _search(cases, starts, ""), _search(cases, starts, setting)
    for (tasks, H, L), a, b, sa, sb in zip(cases, ref["loss"], got["loss"], ref["small"], got["small"]):
        print(f"{setting} (core {got['core']}, default {ref['core']}) {tasks} H={H} L={L}: {b!r} vs {a!r}")
        assert abs(b - a) <= search_rtol(H) * a and sa == sb, (setting, got["core"], tasks, H, L, a, b)


@pytest.mark.parametrize("setting", list(CORE_NEEDS) + [SIMD_OFF])
def test_search_is_the_same_on_every_kernel(setting):
    _same_answer(setting, CHEAP, 2)


@pytest.mark.thorough
@pytest.mark.parametrize("setting", list(CORE_NEEDS) + [SIMD_OFF])
def test_search_is_the_same_on_every_kernel_full(setting):
    _same_answer(setting, FULL, 3)
