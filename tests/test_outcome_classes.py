"""Where random starts land, counted (issue 34): the one end-state classifier
(numerics.evaluate.end_class), the binomial interval of a class's share
(numerics.evaluate.binomial_interval), the counted mix (numerics.experiments.starts.
outcome_mix), the share comparison that can fail (claims.core.share_comparison), its
sentence, and the 'mix' figure kind (reports.render).  All synthetic: seconds."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import beta, binom

from claims.core import Z_SE, mix_figure, mix_phrase, share_comparison
from numerics.experiments.starts import outcome_mix
from numerics.evaluate import allocation, binomial_interval, end_class
from reports.render import RenderError, figure_png


# --- the binomial interval

def test_binomial_interval_is_clopper_pearson():
    """The bounds are the Beta quantiles of the exact two one-sided tests at alpha = erfc(z/sqrt 2)."""
    alpha = math.erfc(4.0 / math.sqrt(2.0))
    for k, n in ((0, 8), (3, 8), (7, 8), (8, 8), (5, 16), (16, 16)):
        lo, hi = binomial_interval(k, n, 4.0)
        assert lo == (0.0 if k == 0 else pytest.approx(beta.ppf(alpha / 2, k, n - k + 1), rel=1e-9))
        assert hi == (1.0 if k == n else pytest.approx(beta.ppf(1 - alpha / 2, k + 1, n - k), rel=1e-9))
        assert lo <= k / n <= hi
    lo, hi = binomial_interval(8, 8, 4.0)
    assert 0.26 < lo < 0.28 and hi == 1.0
    assert binomial_interval(7, 8, 4.0)[1] < 1.0      # one seed of another class rejects a share of 1


def test_binomial_interval_covers():
    """Coverage at least 1 - alpha for every true share (exact: summed over the binomial law)."""
    z, n = 2.0, 8
    alpha = math.erfc(z / math.sqrt(2.0))
    bounds = [binomial_interval(k, n, z) for k in range(n + 1)]
    for p in np.linspace(0.01, 0.99, 41):
        cover = sum(binom.pmf(k, n, p) for k, (lo, hi) in enumerate(bounds) if lo <= p <= hi)
        assert cover >= 1 - alpha - 1e-12, (p, cover)


@pytest.mark.parametrize("k, n, z", [(3, 2, 4.0), (-1, 4, 4.0), (1, 0, 4.0), (1.5, 4, 4.0), (True, 4, 4.0),
                                     (1, 4, 0.0), (1, 4, math.nan)])
def test_binomial_interval_refuses_bad_input(k, n, z):
    with pytest.raises(ValueError):
        binomial_interval(k, n, z)


# --- the one classifier

def _readout(omega, mu):
    return allocation(np.asarray(omega, float), np.asarray(mu, float))


def test_end_class_precedence():
    """diverged > not converged > off D > superposition > allocated / mixed."""
    alloc = _readout([[1.0, 0.0], [0.0, 1.0]], [[1.0, 0.0], [0.0, 1.0]])
    sup = _readout([[1.0, 0.0], [1.0, 1.0]], [[1.0, 0.0], [-1.0, 1.0]])
    assert end_class(alloc, off_D=False, converged=True).name == "allocated"
    s = end_class(sup, off_D=False, converged=True)
    assert s.name == "superposition" and s.superposed == 1 and s.label == "superposition on 1 of 2 tasks"
    assert end_class(sup, off_D=True, converged=True).name == "off D"
    nc = end_class(alloc, off_D=True, converged=False, reason="could still lose 0.1")
    assert nc.name == "not converged" and nc.reason == "could still lose 0.1"
    assert end_class(alloc, off_D=False, converged=True, diverged=True).name == "diverged"
    assert end_class(None, off_D=False, converged=False, diverged=True).name == "diverged"
    assert end_class(alloc.to_dict(), off_D=False, converged=True).name == "allocated"   # as stored
    with pytest.raises(ValueError):
        end_class(None, off_D=False, converged=True)


# --- the counted mix, its comparison and sentence

def _state(label, loss, seed):
    name = "superposition" if label.startswith("superposition") else label
    return {"class": {"name": name, "label": label, "superposed": int(name == "superposition"), "tasks": 2},
            "loss": loss, "init_seed": seed}


def test_outcome_mix_counts_every_class():
    refs = {"allocated_loss": 1.0, "best_decomposable": {"loss": 0.5}}
    states = ([_state("off D", 1.2, k) for k in range(5)] + [_state("allocated", 1.0, 5)]
              + [_state("not converged", 3.0, k) for k in (6, 7)])
    mix = outcome_mix(states, Z_SE, refs)
    assert mix["n"] == 8 and list(mix["labels"]) == ["allocated", "off D", "not converged"]   # OUTCOME_CLASSES order
    e = mix["labels"]["off D"]
    assert e["count"] == 5 and e["seeds"] == [0, 1, 2, 3, 4] and e["interval"] == list(binomial_interval(5, 8, Z_SE))
    assert e["over_allocated"] == pytest.approx(1.2) and e["over_best"] == pytest.approx(2.4)
    assert sum(x["count"] for x in mix["labels"].values()) == 8
    phrase, nums = mix_phrase(mix)
    assert "in 3 classes" in phrase and phrase.count(" of {m_n}") == 3, phrase
    one, _ = mix_phrase(outcome_mix(states[:5], Z_SE, refs))
    assert one.startswith("all {m_n} seeds end off D"), one


def test_share_comparison_can_fail():
    """8 of 8 seeds allocated: share 1 agrees, share 0 rejected; 7 of 8: share 1 rejected; no seed
    decided: undecided (nothing rejected); resolving power in absolute share units."""
    c = share_comparison("s", 8, 8, 1.0, "why", (("share 0", 0.0),))
    assert c.agrees and c.discriminates and c.resolving_power["units"] == "absolute"
    # the smallest detectable move down: the interval's reach below the share, 1 - lo (to the scan's step)
    assert c.resolving_power["low"] == pytest.approx(1 - binomial_interval(8, 8, Z_SE)[0], rel=0.01)
    assert not share_comparison("s", 7, 8, 1.0, "why", (("share 0", 0.0),)).agrees
    assert share_comparison("s", 4, 8, 0.5, "why", (("share 1", 1.0),)).agrees
    none = share_comparison("s", 0, 0, 1.0, "why", (("share 0", 0.0),))
    assert none.error == 0 and not none.discriminates and none.details["decided"] == 0


# --- the 'mix' figure kind

def test_mix_figure_renders_and_refuses_bad_data():
    refs = {"allocated_loss": 1.0}
    a = outcome_mix([_state("off D", 1.2, k) for k in range(3)] + [_state("allocated", 1.0, 3)], Z_SE, refs)
    b = outcome_mix([_state("allocated", 1.0, k) for k in range(4)], Z_SE, refs)
    fig = mix_figure("m", "mix", {"s0=1": a, "s0=0.1": b})
    assert fig.col_labels == ["allocated", "off D"] and fig.matrix == [[1.0, 3.0], [4.0, 0.0]]
    assert figure_png(fig)[:8] == b"\x89PNG\r\n\x1a\n"
    bad = mix_figure("m", "mix", {"s0=1": a})
    bad.matrix = [[1.0, -2.0]]
    with pytest.raises(RenderError, match="finite and >= 0"):
        figure_png(bad)
    bad.matrix = [[1.0]]
    with pytest.raises(RenderError, match="column label"):
        figure_png(bad)


# --- the cost of a plan of starts, before it runs

def test_start_needs_price_their_plan():
    """A "start_runs" need is priced from its parameters (numerics.experiments.starts): seeds on one
    stream cost less than the same seeds on streams of their own (one draw per step), more seeds or more
    evaluations cost more, and the claims' estimates (their plans' needs) grow from tiny to quick to a
    larger configuration."""
    import claims
    from numerics.config import ProblemConfig
    from numerics.engine import cost_of
    from numerics.experiments.starts import start_runs_need
    from numerics.train import TrainConfig

    cfg, tc = ProblemConfig(tasks=(2, 2), heads=2, L=32), TrainConfig(lr=0.1, time=80.0, batch=512, records=41)
    shared = cost_of(start_runs_need("random", [cfg] * 8, tc, 8192, ("s",)))
    own = sum(cost_of(start_runs_need("random", [cfg], tc, 8192, ("s", k))) for k in range(8))
    assert 0 < shared < own
    assert cost_of(start_runs_need("random", [cfg] * 16, tc, 8192, ("s",))) > shared
    own_held_out = [("held out", k) for k in range(8)]
    assert cost_of(start_runs_need("random", [cfg] * 8, tc, 8192, ("s",), held_out=own_held_out)) > shared
    # a researcher's problem runs without the single-task part: the quick sizes as a problem against a larger one
    larger = {"tasks": (3, 3, 3), "heads": 3, "L": 128}     # d = 9: no stability question asked
    for cid in ("boundary-initialisation", "boundary-allocation-race"):
        at_quick = claims.estimate_seconds(cid, "quick", {"tasks": (2, 2), "heads": 2, "L": 32})
        assert claims.estimate_seconds(cid, "tiny") < claims.estimate_seconds(cid, "quick")
        assert at_quick < claims.estimate_seconds(cid, "quick", larger)
