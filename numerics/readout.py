"""The one readout of allocation: which head serves each task in a trained model's (omega, mu),
how much the other heads still carry, and what that makes the model.

Two rules name a task's head, and each is argued once here:

- the **serving head** (largest |mu[h, i]|): the head whose OV value carries task i's output;
  used to say whether a trained model is *allocated* (every off-task |mu| small against the
  serving one, distinct tasks on distinct heads) or a *superposition* (an off-task mu of the
  opposite sign, a head cancelling the softmax's constant part, docs/model.md);
- the **winning head** (largest mu[h, i] omega[h, i], signed): theory's ODE rule reads the
  race in the same product (the warm-up growth rate of a head on a task is proportional to it,
  theory.task_allocation), so a race's measured winner is read the same way, with its *mass
  share* mu omega / sum_h |mu omega|.

Thresholds (each decides which theory applies or whether a race has ended, never an agreement
with a number):
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

ALLOCATED_SHARE = 0.1
"""A trained model is allocated when, for every task, each head but the serving one carries at
most ALLOCATED_SHARE of the serving |mu| (and distinct tasks have distinct serving heads).
Why 0.1: at the allocated fixed point the off-task mu are 0 and a converged run leaves them at
the SGD-noise level (measured <= 0.01 at (2,2), L = 32..64); the run that left allocation
(tasks (2,3), L = 32, sigma 0.5: off-task mu -0.38 against 1.34) was at ~0.3.  Under the
factored metric an off-task mu decays only like 1/t (d mu/dt ~ -2|mu| dL/dmu with dL/dmu ~ mu),
so at t = 20..40 it is still 4-9% of the served one at r = 1 (measured): 0.1, not less."""

SUPERPOSED_SHARE = 0.2
"""A head serves several tasks (a superposition) when its second-largest |mu| is at least 20%
of its largest, and a task is served in signed superposition when heads of both signs carry at
least 20% of its largest |mu|.  docs/model.md's merged run has shares 1.8/3.42 = 0.53 and its factored
run ~0; the merged shares are 0.2-0.5 once the superposition has formed.  Also the share below
which theory's flow has decided a race before a run (boundary-fewer-heads)."""

WINNER_MASS_SHARE = 0.9
"""A task is allocated to its winning head when that head carries at least 90% of
sum_h |mu[h,i] omega[h,i]| (the initialisation boundaries' classification)."""

RACE_DECIDED_SHARE = 2.0 / 3.0
"""A race's winner counts as measured when the leading head carries at least 2/3 of
sum_h |mu omega| at t_end (the loser's share only falls after the race is decided, slowly when
one task is shared by two heads: at t_end = 40 the measured shares were either >= 0.92 or
between 0.5 and 0.88 with the argmax fixed); below, the race has not ended."""


@dataclass(frozen=True)
class Allocation:
    """The allocation readout of one (H, m) pair (omega, mu); see the module docstring."""

    serving_head: tuple          # per task: argmax_h |mu[h, i]|
    same_sign_share: float       # largest off-task |mu| / serving |mu| among same-sign values
    opposite_sign_share: float   # ... among opposite-sign values (a superposition's mark)
    distinct_heads: bool         # distinct tasks on distinct serving heads
    winners: tuple               # per task: argmax_h mu[h, i] omega[h, i]
    mass_share: tuple            # the winner's share of sum_h |mu omega|
    head_share: tuple            # per head: second-largest |mu| over its largest (0: one task)
    runner_up_share: tuple       # per task: runner-up |mu| over the largest
    signed_superposed: tuple     # per task: heads of both signs carry >= SUPERPOSED_SHARE of it

    @property
    def allocated(self) -> bool:
        return bool(max(self.same_sign_share, self.opposite_sign_share) <= ALLOCATED_SHARE and self.distinct_heads)

    @property
    def superposition(self) -> bool:
        """Left allocation for a signed superposition: an opposite-sign off-task value at least
        SUPERPOSED_SHARE of the serving one."""
        return bool(self.opposite_sign_share >= SUPERPOSED_SHARE)

    @property
    def race_decided(self) -> bool:
        return bool(min(self.mass_share) >= RACE_DECIDED_SHARE) if self.mass_share else True

    @property
    def mass_allocated(self) -> bool:
        return bool(min(self.mass_share) >= WINNER_MASS_SHARE) if self.mass_share else True

    def to_dict(self) -> dict:
        return {"serving_head": list(self.serving_head), "same_sign_share": self.same_sign_share,
                "opposite_sign_share": self.opposite_sign_share, "distinct_heads": self.distinct_heads,
                "allocated": self.allocated, "superposition": self.superposition, "winners": list(self.winners),
                "mass_share": list(self.mass_share), "head_share": list(self.head_share),
                "runner_up_share": list(self.runner_up_share), "signed_superposed": list(self.signed_superposed)}


def _second_over_first(values) -> float:
    a = np.sort(np.abs(np.asarray(values, float)))
    return float(a[-2] / a[-1]) if a.size > 1 and a[-1] > 0 else 0.0


def allocation(omega, mu) -> Allocation:
    """The readout of (omega, mu) (each H x m; omega may be None when only mu is known: then
    the winners and mass shares use |omega| = 1)."""
    mu = np.asarray(mu, float)
    omega = np.ones_like(mu) if omega is None else np.asarray(omega, float)
    serving = np.abs(mu).argmax(axis=0)
    same, opposite = 0.0, 0.0
    for i, h in enumerate(serving):
        ref = mu[h, i]
        for k in range(mu.shape[0]):
            if k == h or ref == 0:
                continue
            share = abs(mu[k, i] / ref)
            if mu[k, i] * ref >= 0:
                same = max(same, share)
            else:
                opposite = max(opposite, share)
    B = mu * omega
    win = np.argmax(B, axis=0)
    tot = np.abs(B).sum(axis=0)
    mass = [float(B[w, i] / tot[i]) if tot[i] > 0 else 0.0 for i, w in enumerate(win)]
    top = np.abs(mu).max(axis=0)
    signed = [bool(np.any(mu[:, i] > SUPERPOSED_SHARE * top[i]) and np.any(mu[:, i] < -SUPERPOSED_SHARE * top[i]))
              for i in range(mu.shape[1])]
    return Allocation(serving_head=tuple(int(h) for h in serving), same_sign_share=float(same),
                      opposite_sign_share=float(opposite), distinct_heads=len(set(serving.tolist())) == mu.shape[1],
                      winners=tuple(int(h) for h in win), mass_share=tuple(mass),
                      head_share=tuple(_second_over_first(row) for row in mu),
                      runner_up_share=tuple(_second_over_first(mu[:, i]) for i in range(mu.shape[1])),
                      signed_superposed=tuple(signed))


OUTCOME_CLASSES = ("allocated", "superposition", "off D", "mixed", "not converged", "diverged")
"""Where a trained run ends, by precedence (:func:`end_class`): ``diverged`` (the loss blew up:
numerics.train.TrainingDiverged), ``not converged`` (still in its warm-up, or the loss it could
still lose exceeds its comparison's tolerance: numerics.experiments.converged.converged_for),
``off D`` (its movable off-D part built by the flow: numerics.experiments.starts.off_D_test),
``superposition`` (on k of the m tasks: heads of both signs carry >= SUPERPOSED_SHARE of the
task, :attr:`Allocation.signed_superposed`), ``allocated`` (:attr:`Allocation.allocated`),
``mixed`` (none of these: heads sharing tasks with one sign, or fewer heads than tasks).  The
order is that of what each class needs: a class is read only once the run has converged, and
the readout of (omega, mu) means what it says only on D."""


@dataclass(frozen=True)
class EndClass:
    """The class of one run's end state (:data:`OUTCOME_CLASSES`); ``superposed``: how many of
    its ``tasks`` are in signed superposition (the k of "superposition on k of m tasks");
    ``reason``: why a run is not converged or diverged."""

    name: str
    superposed: int
    tasks: int
    reason: str = ""

    @property
    def label(self) -> str:
        """The class as counted: a superposition on k of m tasks is its own class for each k."""
        return f"superposition on {self.superposed} of {self.tasks} tasks" if self.name == "superposition" else self.name

    def to_dict(self) -> dict:
        return {"name": self.name, "label": self.label, "superposed": self.superposed, "tasks": self.tasks,
                "reason": self.reason}


def end_class(readout, *, off_D: bool, converged: bool, diverged: bool = False, reason: str = "") -> EndClass:
    """The one classifier of a trained run's end state (:data:`OUTCOME_CLASSES`, by precedence)
    from its final readout (an :class:`Allocation`, or its ``to_dict()`` as stored; None for a
    diverged run), whether its movable off-D part was built by the flow (``off_D``) and whether it
    has converged; ``reason`` is kept for a run not converged or diverged."""
    if readout is None:
        if not diverged:
            raise ValueError("end_class needs the run's readout (numerics.readout.allocation) unless it diverged")
        return EndClass("diverged", 0, 0, reason)
    a = readout.to_dict() if isinstance(readout, Allocation) else readout
    signed = list(a["signed_superposed"])
    k, m = int(sum(bool(x) for x in signed)), len(signed)
    if diverged:
        return EndClass("diverged", 0, m, reason)
    if not converged:
        return EndClass("not converged", k, m, reason)
    if off_D:
        return EndClass("off D", k, m)
    if k > 0:
        return EndClass("superposition", k, m)
    return EndClass("allocated" if a["allocated"] else "mixed", 0, m)


ZERO_SUM_SHARE = 0.1
"""A task is carried by a zero-sum group of OV values when |sum_h mu[h, i]| is at most 10% of
sum_h |mu[h, i]|: the heads cancel the softmax's constant part (docs/model.md; He et al., ICML 2025).
The same 0.1 as the single-task boundary's pair ratio |mu_a + mu_b| / (|mu_a| + |mu_b|) < 0.1
(numerics.experiments.starts.single_task_summary), of which this is the many-head form; the measured pairs from
PyTorch's default start sit near 0 (3 of 3 runs), an allocated task at 1."""


def zero_sum_ratio(mu) -> tuple:
    """Per task |sum_h mu[h, i]| / sum_h |mu[h, i]| (1: one sign, 0: the heads cancel exactly;
    nan for a task no head carries)."""
    mu = np.asarray(mu, float)
    tot = np.abs(mu).sum(axis=0)
    return tuple(float(abs(mu[:, i].sum()) / tot[i]) if tot[i] > 0 else math.nan for i in range(mu.shape[1]))


def crossing_time(t, shares, threshold: float, eligible=None) -> float:
    """The first time a share reaches ``threshold`` (where ``eligible``, if given, is true:
    e.g. an off-task value on the opposite-sign branch), log-interpolated between the two
    records around the crossing; inf if it never does by the last record, the first record's
    time if it starts there.  The escape-time readout of the saddle and of the atlas."""
    t, s = np.asarray(t, float), np.asarray(shares, float)
    hit = s >= threshold
    if eligible is not None:
        hit &= np.asarray(eligible, bool)
    ok = np.flatnonzero(hit)
    if ok.size == 0:
        return math.inf
    j = int(ok[0])
    if j == 0:
        return float(t[0])
    a, b = math.log(max(s[j - 1], 1e-300)), math.log(s[j])
    f = (math.log(threshold) - a) / (b - a) if b > a else 1.0
    return float(t[j - 1] + min(max(f, 0.0), 1.0) * (t[j] - t[j - 1]))
