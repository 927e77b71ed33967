"""Claim 4 (theory side): the allocated fixed point and the predicted winners."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

from theory import reduced_ode as ro
from theory.task_allocation import (allocated_fixed_point, allocated_point, allocated_task_point,
                                    predicted_winners, served_relaxation_rates, warmup_race_times)


def test_allocated_point_matches_spec_and_is_a_local_minimum():
    """docs/model.md: r = 4, m = 3, L = 1000 -> omega* ~ 0.373, mu* ~ 2.645; r = 3, L = 128 ->
    (0.40, 2.31).  The mpmath root has gradient ~1e-30 (30 digits)."""
    om, mu = allocated_fixed_point((4, 4, 4), 1000)
    assert np.allclose(om, 0.373, atol=5e-4) and np.allclose(mu, 2.645, atol=5e-4)
    p = allocated_task_point(3, 128)
    assert round(p["omega_star"], 2) == 0.40 and round(p["mu_star"], 2) == 2.31
    assert p["grad_norm"] < 1e-20 and p["local_min"] and p["valid"]


@pytest.mark.parametrize("r, L", [(23, 1000.0), (24, 1000.0), (32, 1000.0), (16, 128.0), (16, 16.0)])
def test_allocated_point_is_found_where_newton_from_the_limit_overshoots(r, L):
    """Newton in (omega, mu) from (sqrt(w*), 1/sqrt(w*)) fails at these (r, L), or lands on the
    origin or a saddle: the profile's stationary point nearest sqrt(w*) is the strict minimum."""
    p = allocated_task_point(r, L)
    assert p["grad_norm"] < 1e-20 and p["local_min"] and p["valid"] and p["omega_star"] > 0.1


def _velocity(omega, mu, tasks, L, sigma, param):
    """(d omega/dt, d mu/dt) of the expansion flow with the metric of ``param``."""
    g_om, g_mu = ro.expansion_gradient(omega, mu, tasks, L, sigma)
    f_om, f_mu = ro.metric_factors(param, omega, mu, tasks)
    return -f_om * g_om, -f_mu * g_mu


@given(tasks=st.lists(st.integers(1, 6), min_size=1, max_size=3).map(tuple),
       L=st.sampled_from([64, 256, 1000]), sigma=st.sampled_from([0.0, 0.5]))
def test_allocated_point_is_a_fixed_point_of_the_factored_flow_only(tasks, L, sigma):
    """In the full H x m expansion, the allocated point has zero factored velocity (the
    served entries are stationary, the others have zero metric) but a nonzero merged
    velocity on the off-task mu (dL/dmu[h,j] = (2/L) mu*_j Q (r_j + sigma^2) != 0 for m > 1)."""
    m = len(tasks)
    om_s, mu_s = allocated_fixed_point(tasks, L, sigma)
    om, mu = allocated_point(list(range(m)), om_s, mu_s, m)
    v_om, v_mu = _velocity(om, mu, tasks, L, sigma, "factored")
    assert np.max(np.abs(v_om)) < 1e-9 and np.max(np.abs(v_mu)) < 1e-9
    if m > 1:
        w_om, w_mu = _velocity(om, mu, tasks, L, sigma, "merged")
        assert np.max(np.abs(w_mu)) > 1e-4
    # a perturbed point (mu* off by 1%) is not stationary (the check can fail)
    v_om, v_mu = _velocity(om, mu * 1.01, tasks, L, sigma, "factored")
    assert np.max(np.abs(v_mu)) > 1e-6


@given(perm=st.permutations([0, 1, 2]), s0=st.sampled_from([0.05, 0.15]))
def test_predicted_winners_follow_the_favoured_head(perm, s0):
    """Head perm[i] favoured on task i (mu0 = 2 s0 there): every rule predicts it wins,
    and the ode's end point is allocated to it; a wrong winner (a cyclic shift) differs."""
    tasks = (3, 3, 3)
    om0 = np.full((3, 3), s0)
    mu0 = np.full((3, 3), s0)
    mu0[list(perm), [0, 1, 2]] = 2 * s0
    expected = list(perm)
    assert predicted_winners(om0, mu0, rule="largest_mu") == expected
    assert predicted_winners(om0, mu0, tasks, rule="warmup_race") == expected
    assert predicted_winners(om0, mu0, tasks, L=1000, rule="ode") == expected
    assert predicted_winners(om0, mu0, tasks, L=1000, rule="ode") != expected[1:] + expected[:1]


def test_warmup_race_is_won_by_a_larger_omega_too():
    """The race time depends on omega0 as well: with equal mu0 the larger omega0 escapes
    first (T = 1/(4 r omega0) when mu0 = r s omega0), which the ode confirms."""
    om0 = np.array([[0.05, 0.05], [0.08, 0.05]])
    mu0 = np.array([[0.1, 0.1], [0.1, 0.12]])
    T = warmup_race_times(om0, mu0, (2, 2))
    assert T[1, 0] < T[0, 0]
    assert predicted_winners(om0, mu0, (2, 2), rule="warmup_race")[0] == 1
    assert predicted_winners(om0, mu0, (2, 2), L=500, rule="ode")[0] == 1


def test_bad_input():
    with pytest.raises(ValueError, match="rule"):
        predicted_winners([[0.1]], [[0.1]], (1,), rule="biggest")
    with pytest.raises(ValueError, match="needs the context length"):
        predicted_winners([[0.1]], [[0.1]], (1,), rule="ode")
    with pytest.raises(ValueError, match="only 1 heads"):
        allocated_point([0, 1], [0.3, 0.3], [2.0, 2.0], 1)
    with pytest.raises(ValueError, match="L"):
        allocated_fixed_point((2,), -5)


def test_served_relaxation_rate_is_the_late_decay_of_theorys_flow():
    # the slowest rate from the Jacobian (central differences) against theory's own exact flow: from a start off the
    # served fixed point, |(omega, mu) - (omega*, mu*)| decays as e^(-lambda t) once the fast mode has died
    from theory.exact import exact_flow, exact_fixed_point
    tasks, L = (2, 3), 64
    rates = served_relaxation_rates(tasks, L)
    fp = exact_fixed_point(tasks, L)
    assert rates.shape == (2,) and np.all(rates > 0) and rates[0] != rates[1]
    for i, r in enumerate(tasks):
        star = np.array([fp["omega_star"][i], fp["mu_star"][i]])
        flow = exact_flow([[star[0] + 0.02]], [[star[1]]], (r,), L, t_end=16.0, t_eval=[6.0, 16.0])
        dist = [np.hypot(flow.omega[k, 0, 0] - star[0], flow.mu[k, 0, 0] - star[1]) for k in range(2)]
        assert np.log(dist[0] / dist[1]) / 10.0 == pytest.approx(rates[i], rel=0.02)
