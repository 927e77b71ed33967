"""theory's range checks (the package module): a value theory cannot return is refused with the
function, the quantity and the value named; each public function that returns a loss, a minimum, a rate
or a time sends it through them (a closed form patched to return an impossible value is
refused where it surfaces)."""
import math

import numpy as np
import pytest

import theory as v
from theory import exact, limiting_error, optimality, reduced_ode, saddle, task_allocation


def test_in_range_names_function_value_and_reason():
    assert v.in_range("f", "x", 0.5, 0.0, 1.0) == 0.5
    with pytest.raises(ValueError, match=r"^f: x = -0.25 cannot be: it must lie in \[0, 1\], finite \(why\)$"):
        v.in_range("f", "x", -0.25, 0.0, 1.0, "why")
    with pytest.raises(ValueError, match="nan"):
        v.in_range("f", "x", np.array([0.1, np.nan]))
    assert np.isnan(v.in_range("f", "x", np.array([0.1, np.nan]), nan_ok=True)[1])
    with pytest.raises(ValueError, match="inf"):
        v.in_range("f", "x", math.inf, 0.0)
    assert v.in_range("f", "x", math.inf, 0.0, infinite_ok=True) == math.inf
    with pytest.raises(ValueError, match="-inf"):            # inf only at an end of its range
        v.in_range("f", "x", -math.inf, 0.0, infinite_ok=True)


def test_loss_range_allows_only_the_stated_error():
    assert v.check_loss("f", -1e-9, error=1e-8) == -1e-9
    with pytest.raises(ValueError, match="f: loss = -1e-07"):
        v.check_loss("f", -1e-7, error=1e-8)


def test_minimum_against_linear_attention():
    """Inside the large-L domain a minimum below linear_attention_loss (1 - (r+1+s^2)/L) is
    refused, at the edge of that slack it passes; below the domain only the sign counts; a
    limit below linear_attention_limit is refused."""
    tasks, L = (3, 3), 1000.0
    lin, slack = v.linear_attention_loss(tasks, L), 4 / L
    assert v.check_minimum("f", lin * (1 - slack), tasks, L) == lin * (1 - slack)
    with pytest.raises(ValueError, match="f: minimum = .* linear attention"):
        v.check_minimum("f", lin * (1 - 1.01 * slack), tasks, L)
    assert not v.large_L(tasks, 20.0) and v.check_minimum("f", 1e-6, tasks, 20.0) == 1e-6
    with pytest.raises(ValueError, match="loss = -0.001"):
        v.check_minimum("f", -1e-3, tasks, 20.0)
    limit = v.linear_attention_limit(tasks)
    assert v.check_minimum("f", limit, tasks) == limit
    with pytest.raises(ValueError, match="L \\* loss"):
        v.check_minimum("f", 0.99 * limit, tasks)


def test_negative_expansion_is_refused(monkeypatch):
    """The pair weights' excess pushed down by 10: the expansion's pair term goes negative and
    expansion_loss refuses the value; halved (its first-order part is linear attention's
    r(r+1+s^2) term), profile_mu's minimum near omega = 0 falls to half of linear attention's
    loss with the quadratic still positive definite, and profile_mu refuses it."""
    om, mu = np.array([[0.3, 0.0], [0.0, 0.3]]), np.array([[3.3, 0.0], [0.0, 3.3]])
    valley = optimality.linear_attention_point((3, 3), 3, 0.05)[0]
    assert reduced_ode.expansion_loss(om, mu, (3, 3), 200.0) > 0 and reduced_ode.profile_mu(valley, (3, 3), 1000.0)[2]
    pieces = reduced_ode._pieces
    monkeypatch.setattr(reduced_ode, "_pieces",
                        lambda *a: {**pieces(*a), "X_excess": pieces(*a)["X_excess"] - 10.0})
    with pytest.raises(ValueError, match="theory.reduced_ode.expansion_loss: loss = -"):
        reduced_ode.expansion_loss(om, mu, (3, 3), 200.0)
    monkeypatch.setattr(reduced_ode, "_pieces", lambda *a: {**pieces(*a), "X_excess": 0.5 * pieces(*a)["X_excess"]})
    with pytest.raises(ValueError, match="theory.reduced_ode.profile_mu: minimum = .* linear attention"):
        reduced_ode.profile_mu(valley, (3, 3), 1000.0)


def test_exact_loss_below_its_error_is_refused(monkeypatch):
    """one_head_terms with C = 0: loss = r - 2 mu b < 0 at mu = 2, far beyond the error bound."""
    terms = exact.one_head_terms
    monkeypatch.setattr(exact, "one_head_terms", lambda *a: (lambda b, C, eb, eC: (b, 0 * C, eb, eC))(*terms(*a)))
    with pytest.raises(ValueError, match="theory.exact.exact_loss: loss = -"):
        exact.exact_loss([[0.3]], [[2.0]], (3,), 64)


def test_limits_and_allocated_minimum_refuse_impossible_parts(monkeypatch):
    """minimise_F returning a negative minimum: limit_multi refuses it; allocated_task_point
    returning a negative loss: allocated_loss_at_L refuses it; a single-head limit below the
    allocated one: gain refuses it (one head's objective is >= the allocated sum)."""
    monkeypatch.setattr(limiting_error, "minimise_F", lambda r, D, s=0.0, dps=30: (0.1, -1.0))
    with pytest.raises(ValueError, match="theory.limiting_error.limit_multi: loss = -2"):
        limiting_error.limit_multi((2, 2))
    monkeypatch.setattr(task_allocation, "allocated_task_point", lambda r, L, s=0.0, dps=30: {"loss": -0.01})
    with pytest.raises(ValueError, match="theory.task_allocation.allocated_loss_at_L: loss"):
        task_allocation.allocated_loss_at_L((2, 2), 100.0)
    monkeypatch.undo()
    monkeypatch.setattr(limiting_error, "limit_single", lambda tasks, s=0.0: 0.9 * limiting_error.limit_multi(tasks, s))
    with pytest.raises(ValueError, match="theory.limiting_error.gain: gain"):
        limiting_error.gain((2, 2))


def test_search_refuses_a_minimum_below_linear_attention(monkeypatch):
    """The search's own result against the bound: with linear attention's loss doubled the
    best decomposable loss found (the linear-attention limit of the expansion) lies below it,
    and best_decomposable_attention refuses to return it."""
    monkeypatch.setattr(v, "linear_attention_loss", lambda *a, **k: 2.0 * 0.0588)
    with pytest.raises(ValueError, match="theory.optimality.best_decomposable_attention: minimum"):
        optimality.best_decomposable_attention((2,), 2, 100.0, starts=2)


def test_rates_and_times_have_their_sign():
    """An escape time is >= 0 (inf when there is no escape): a seed above its threshold is
    refused; gradient descent's growth rate needs lr a > -1; the merged warm-up race time of a
    start already past warm-up (amplitude >= 1) is 0, not negative."""
    assert saddle.escape_time(0.5, 1.0, 1e-3) > 0 and saddle.escape_time(-0.5, 1.0, 1e-3) == math.inf
    with pytest.raises(ValueError, match="theory.saddle.escape_time: escape time"):
        saddle.escape_time(0.5, 1e-3, 1.0)
    with pytest.raises(ValueError, match="theory.saddle.gd_growth_rate"):
        saddle.gd_growth_rate(-30.0, 0.05)
    assert saddle.escape_time_slope(0.0) == math.inf and saddle.escape_time_slope(0.5) == 4.0
    T = task_allocation.warmup_race_times(np.full((2, 2), 0.8), np.full((2, 2), 1.6), (2, 2), "merged")
    assert np.all(T == 0.0)
    T_small = task_allocation.warmup_race_times(np.full((2, 2), 0.05), np.full((2, 2), 0.1), (2, 2), "merged")
    assert np.all(T_small > 0)
