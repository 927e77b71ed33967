"""Claim 1: started from decomposable weights, gradient flow keeps them decomposable.

What is run and why it can decide the claim:

1. **Exactly symmetric batches** (:func:`check_symmetrised_exact`).  The loss of a batch
   made of whole orbits of the finite group G of :func:`theory.block_structure.symmetry_group`
   (coordinate sign flips and cyclic shifts inside each task block, per-task output sign
   flips; |G| = 2^(d+m) prod r_i) is G-invariant, and the fixed set of G is exactly D, so
   gradient descent from a point of D stays in D *exactly*; in floating point the residual
   ||theta - P_D theta|| / ||theta|| is rounding only.  Tolerance: each step adds at most a
   few round-offs (relative eps of the dtype) per entry to the off-D part, carried along and
   amplified at most as much as a tiny off-D perturbation is (measured by a twin run), so
   after n steps residual <= c n eps A(t), c = 64.  Perturbations -- wrong symmetry groups,
   i.e. wrong invariant subspaces, sent through the same rounding comparison: (i) "the
   per-task output sign flips alone fix D" (d >= 2): on a batch symmetric under that
   subgroup only the flow must leave D (through the non-block-scalar part of W_XX);
   (ii) "the x symmetries alone fix D" (m >= 2): the flow must leave D (through the
   off-diagonal of U_Y); (iii) "any G-orbit minus one element fixes D".  (i) and (ii) are
   what a residual meter blind to those directions -- a P_D that keeps W_XX and U_Y whole --
   cannot reject, so such a meter makes the verdict ``error``.
2. **Fresh Monte-Carlo batches** (:func:`check_structure_preserved`), through
   ``numerics.train.train``.  The population gradient at a point of D lies in D (SPEC.md:
   the data law is invariant under block rotations and sign flips), so the off-D part of
   each step's update is pure Monte-Carlo noise of mean zero.  We *measure* its size:
   at every recorded (omega, mu) we rebuild the decomposable model, take one GD step on
   ``n_probe`` independent batches of the run's batch size, and average the squared norm
   nu^2 of the off-D part of the change of the merged weights (W, U).  Independent
   increments add in quadrature, so after n steps E||delta||^2 = sum_k nu_k^2 (nu between
   two records: the larger of the two ends).  ||delta||^2 is (by the CLT) a Gaussian
   quadratic form, whose tail is at worst that of chi^2 with one degree of freedom:
   P(||delta|| > Z_SE rms) <= 6e-5 (claims.common.Z_SE = 4).  nu^2 itself is estimated
   from few probes: a quadratic form with k effective dimensions makes that estimate
   chi^2_{Nk} / (Nk) distributed (N probes so far; k = 2/CV^2 estimated from the pooled
   probes, halved, at least 1): the accumulated variance is replaced by its upper confidence
   bound at the same tail probability (factor Nk / chi2_{Nk}^{-1}(6e-5)).
   The bound is therefore
       residual(t) <= Z_SE sqrt(UCB sum_{k < t/lr} nu_k^2) / ||P_D theta(t)||  (+ rounding floor).
   What the bound ignores: the linearised dynamics of the off-D part (if D were unstable
   the noise would be amplified and the claim would *fail* the check, as it should) and
   O(lr^2) products of noise.  Perturbations (broken structures held to the same bound):
   a non-decomposable start (``random_full``), and a start in D_+ \\ D, D_+ = {W_XX and U_Y
   unrestricted} (the set a P_D keeping W_XX and U_Y whole would call decomposable;
   d >= 2 or m >= 2), kicked off D by KICK relative size.  (The former "no-noise" perturbation
   -- residual at the rounding floor -- is dropped: any Monte-Carlo noise rejects it.)

Domain (decided from theory before any run): every start in D (init decomposable,
random_decomposable or given), any tasks, H, L, sigma, parametrisation and basis: the
symmetry argument has no condition on them.  The exact check is run where the symmetrised
batch is affordable (|G| base_prompts L <= the profile's ``max_exact_tokens``; a cost, not a
domain: a case above it is recorded as not run in ``details["ran"]``).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch
from scipy.stats import chi2, norm

from claims.base import ClaimResult, Figure, Series, no_progress, run_claim
from claims.common import (Z_SE, Comparison, check_profile, comparisons_result, headline_row, perturbation,
                           trajectory_of, worst)
from numerics.config import ProblemConfig
from numerics.data import make_generator, sample_prompts
from numerics.model import MultiHeadAttention, TrainingDiverged
from numerics.symmetry import symmetrize_full, symmetrize_subgroup
from numerics.train import TrainConfig, train
from theory.block_structure import group_order, off_decomposable_parts, project_decomposable

CLAIM_ID = "block-structure"
TITLE = "Block structure is preserved"
STATEMENT = ("Started from block-structured (decomposable) weights, gradient flow keeps them so: only "
             "the X-X block of each head's QK weight and the Y block of each head's OV weight are ever "
             "nonzero, each diagonal in the task basis (for both parametrisations and any basis Phi).")


@dataclass(frozen=True)
class BlockStructureProfile:
    """What claim 1 runs at one profile (every case: each param x each basis)."""

    # exactly G-invariant batches (check_symmetrised_exact)
    exact_tasks: tuple = ((2, 1),)      # block sizes of the exact cases (|G| = 2^(d+m) prod r_i)
    exact_heads: int = 2                # H
    exact_L: int = 8                    # context length
    exact_steps: int = 60               # GD steps on the fixed symmetric batch
    exact_base_prompts: int = 1         # prompts whose whole G-orbits make the batch
    max_exact_tokens: int = 2 ** 22     # cost cap |G| base_prompts L of one exact batch
    # fresh Monte-Carlo batches (check_structure_preserved)
    fresh_tasks: tuple = ((2, 2),)
    fresh_heads: int = 2
    fresh_L: int = 16
    batch: int = 1024                   # fresh prompts per GD step (at 128 the bound, with the probes'
                                        # own uncertainty, is >= 1 at (2,2), L = 16: uninformative)
    time: float = 6.0                   # t_end of the fresh-batch runs
    records: int = 7                    # records (bound evaluated at each)
    n_probe: int = 4                    # probe batches per record measuring the off-D step noise
    lr: float = 0.05                    # GD step (both checks)
    sigma: float = 0.0                  # label noise of every case
    params: tuple = ("factored", "merged")
    bases: tuple = ("identity", "random")


PROFILES = {
    "tiny": BlockStructureProfile(exact_tasks=((1, 1),), exact_L=4, exact_steps=20, fresh_tasks=((1, 1),),
                                  fresh_L=8, batch=256, time=1.0, records=5, params=("factored",),
                                  bases=("identity",)),
    "quick": BlockStructureProfile(),
    # paper scale (SPEC: r = 3, m = 2, H = 2, L = 128, batch 2048, lr 0.05; a GPU run)
    "paper": BlockStructureProfile(exact_tasks=((2, 2),), exact_L=32, exact_steps=400, exact_base_prompts=4,
                                   fresh_tasks=((3, 3),), fresh_L=128, batch=2048, time=60.0, records=31),
}

ROUNDING_PER_STEP = 64.0
"""c in the exact-symmetry tolerance c * n_steps * eps * amplification (module docstring)."""

TWIN_SIZE = 1e-9
"""Relative size of the off-D perturbation of the twin run that measures amplification."""

NU2_TAIL = float(2.0 * norm.sf(Z_SE))
"""Tail probability of the upper confidence bound on the measured off-D step noise nu^2:
the same as the policy's Z_SE standard errors (6.3e-5)."""

KICK = 0.05
"""Relative size of the D_+ \\ D kick of the broken-structure start of the fresh-batch check."""

DOMAIN = ("every start in D (decomposable / random_decomposable / given init), any tasks, H, L, sigma, "
          "parametrisation and basis Phi: the symmetry argument (G-invariance of the data law, Fix(G) = D) "
          "has no condition on them")


def _eps(cfg) -> float:
    """Unit round-off of the configuration's dtype."""
    return float(np.finfo(np.float32 if cfg.dtype == "float32" else np.float64).eps)


def _check_start_in_D(cfg, what: str) -> None:
    if cfg.init not in ("decomposable", "random_decomposable", "given"):
        raise ValueError(f"{what} starts from a point of D; cfg.init={cfg.init!r} is not one "
                         "(use 'decomposable', 'random_decomposable' or 'given')")


# ---------------------------------------------------------------------------------------
# 1. exactly symmetric batches
# ---------------------------------------------------------------------------------------

def wrong_groups(cfg) -> list[tuple[str, str]]:
    """(subgroup, description) of the wrong-group predictions that apply to cfg: a subgroup
    whose fixed set is strictly larger than D (output sign flips alone: d >= 2; x symmetries
    alone: m >= 2)."""
    out = []
    if cfg.d >= 2:
        out.append(("output_signs", "wrong group: the per-task output sign flips alone fix D "
                                    "(batch symmetric under them only must keep D to rounding)"))
    if cfg.m >= 2:
        out.append(("x_symmetries", "wrong group: the x sign flips and block shifts alone fix D "
                                    "(batch symmetric under them only must keep D to rounding)"))
    return out


def check_symmetrised_exact(cfg, lr: float = 0.05, steps: int = 60, base_prompts: int = 1,
                            seed: int = 0, records: int = 7) -> Comparison:
    """Gradient descent on one fixed batch made of ``base_prompts`` whole G-orbits from the
    point of D of cfg's init; the off-D residual must stay at rounding level.  The same
    comparison, with the same tolerance, is run for the wrong-group predictions
    (:func:`wrong_groups`) and for a G-orbit with one element dropped: each must be rejected."""
    _check_start_in_D(cfg, "the exact-symmetry check")
    gen = make_generator(seed, cfg.device)
    base = sample_prompts(cfg, base_prompts, gen)
    sym = symmetrize_full(base, cfg)
    every = max(1, steps // (records - 1))
    run = _fixed_batch_run(cfg, sym, lr, steps, every)
    # amplification of off-D errors by the flow on this batch: a twin run started with a
    # tiny random off-D perturbation (relative size TWIN_SIZE) measures the growth
    # G(t) = residual_twin(t) / residual_twin(0) in the linear regime; a rounding error made
    # at record time s is amplified by at most max(1, G(t) / G(s)) by time t
    twin = MultiHeadAttention(cfg)
    tgen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in twin.parameters():
            p += TWIN_SIZE * (p.abs().max() + 1e-3) * torch.randn(p.shape, generator=tgen, dtype=torch.float64).to(p)
    run_twin = _fixed_batch_run(cfg, sym, lr, steps, every, start=twin)
    growth = np.asarray(run_twin["residual"]) / max(float(run_twin["residual"][0]), 1e-300)
    amp = np.array([max(1.0, float(np.max(growth[j] / growth[: j + 1]))) for j in range(len(growth))])
    n_steps = np.rint(np.asarray(run["t"]) / lr) + 1
    tol_t = ROUNDING_PER_STEP * n_steps * _eps(cfg) * amp
    ratio = np.asarray(run["residual"]) / tol_t
    j = int(np.argmax(ratio))
    tol = float(tol_t[j])
    measured = float(run["residual"][j])
    perts, wrong_residuals = [], {}
    batches = [(keep, description, symmetrize_subgroup(base, cfg, keep)) for keep, description in wrong_groups(cfg)]
    batches.append(("one_dropped", "a G-orbit with one element dropped keeps D to rounding",
                    symmetrize_full(base, cfg, drop=1)))
    for keep, description, batch in batches:
        # the same comparison on the records the run reached (a batch off the symmetry can
        # make the flow diverge once it leaves D)
        run_w = _fixed_batch_run(cfg, batch, lr, steps, every, until_divergence=True)
        res_w = np.asarray(run_w["residual"])
        wrong_residuals[keep] = res_w
        perts.append(perturbation(description, float(np.max(res_w / tol_t[: len(res_w)])), 1.0,
                                  max_residual=float(np.max(res_w)), diverged=run_w["diverged"]))
    res_drop = wrong_residuals.pop("one_dropped")
    why = (f"exact G-invariance of the batch (|G| = {group_order(cfg.tasks)}): residual is rounding only, "
           f"<= {ROUNDING_PER_STEP:g} x steps x eps x (amplification of off-D errors measured by a perturbed "
           f"twin run, max {float(np.max(amp)):.3g}); compared at the worst record")
    return Comparison(
        name=f"symmetrised-exact tasks={cfg.tasks} H={cfg.heads} L={cfg.L} {cfg.param} {cfg.basis}",
        measured=measured, predicted=0.0, error=measured, tolerance=tol, why=why, perturbations=perts,
        details={"config": cfg.to_dict(), "lr": lr, "steps": steps, "seed": seed,
                 "batch": sym.batch, "group_order": group_order(cfg.tasks),
                 "t": run["t"], "residual": run["residual"], "residual_wrong_group": wrong_residuals,
                 "residual_one_dropped": res_drop, "tolerance_t": tol_t, "off_D_amplification": amp,
                 "final_off_D_parts": run["parts"][-1], "final_omega": run["omega"][-1], "final_mu": run["mu"][-1]},
    )


def _fixed_batch_run(cfg, prompts, lr: float, steps: int, every: int, start=None,
                     until_divergence: bool = False) -> dict:
    """GD of the full model on one fixed batch (``numerics.train.train``), recorded every
    ``every`` steps: t, loss, omega, mu, residual and the off-D parts of the merged weights.
    ``until_divergence``: a run that diverges (a perturbation's batch can make the flow
    blow up once it leaves D) returns its residuals up to the last record before that."""
    parts, early = [], {"t": [], "residual": []}

    def record_parts(step, t, model, loss):
        W, U = _merged_numpy(model)
        parts.append(off_decomposable_parts(W, U, cfg.tasks, cfg.basis_numpy()))
        if until_divergence and np.all(np.isfinite(W)) and np.all(np.isfinite(U)):
            early["t"].append(t)
            early["residual"].append(model.semi_singular_values().residual)

    try:
        res = train(cfg, TrainConfig(lr=lr, time=lr * steps, records=2), batches=lambda k: prompts,
                    record_every=every, on_record=record_parts, start=start)
    except TrainingDiverged:
        if not until_divergence:
            raise
        return {"t": np.array(early["t"]), "residual": np.array(early["residual"]), "parts": parts, "diverged": True}
    tr = trajectory_of(res)
    return {"t": tr.t, "loss": tr.loss, "omega": tr.omega, "mu": tr.mu, "residual": tr.residual, "parts": parts,
            "diverged": False}


# ---------------------------------------------------------------------------------------
# 2. fresh Monte-Carlo batches: residual within the noise bound
# ---------------------------------------------------------------------------------------

def _merged_numpy(model) -> tuple[np.ndarray, np.ndarray]:
    W, U = model.merged_weights()
    return W.detach().cpu().double().numpy(), U.detach().cpu().double().numpy()


def off_D_step_noise_samples(cfg, omega, mu, lr: float, batch: int, n_probe: int, generator) -> np.ndarray:
    """||P_perp(theta_1 - theta_0)||^2 on each of ``n_probe`` fresh batches: the squared norm
    of the off-D part of the change of the merged weights (W, U) in one GD step of size lr
    (``numerics.train.train``, one step on that batch) from the decomposable point (omega, mu)."""
    base = MultiHeadAttention.from_semi_singular_values(cfg, omega, mu)
    W0, U0 = _merged_numpy(base)
    one_step = TrainConfig(lr=lr, time=lr, records=2)
    out = []
    for _ in range(n_probe):
        prompts = sample_prompts(cfg, batch, generator)
        res = train(cfg, one_step, batches=lambda k: prompts, start=copy.deepcopy(base))
        W1, U1 = _merged_numpy(res.final_model)
        dW, dU = W1 - W0, U1 - U0
        dWD, dUD = project_decomposable(dW, dU, cfg.tasks, cfg.basis_numpy())
        out.append(float(np.sum((dW - dWD) ** 2) + np.sum((dU - dUD) ** 2)))
    return np.array(out)


def off_D_step_noise(cfg, omega, mu, lr: float, batch: int, n_probe: int, generator) -> float:
    """nu^2: the mean of :func:`off_D_step_noise_samples`."""
    return float(np.mean(off_D_step_noise_samples(cfg, omega, mu, lr, batch, n_probe, generator)))


def noise_bound(cfg, tcfg, t: np.ndarray, omega: np.ndarray, mu: np.ndarray, n_probe: int = 4,
                probe_seed: int = 10_000) -> dict:
    """The Monte-Carlo bound on the relative residual at the record times (module docstring).

    Returns ``nu2`` (per record), ``rms`` (sqrt of the accumulated variance, per record),
    ``norm_D`` (||P_D theta|| per record), ``floor`` and ``bound`` = Z_SE rms / norm_D + floor."""
    gen = make_generator(probe_seed + tcfg.seed, cfg.device)
    samples = np.array([off_D_step_noise_samples(cfg, om, m_, tcfg.lr, tcfg.batch, n_probe, gen)
                        for om, m_ in zip(omega, mu)])                     # (records, n_probe)
    nu2 = samples.mean(axis=1)
    steps = np.rint(np.diff(t) / tcfg.lr)
    var_hat = np.concatenate([[0.0], np.cumsum(steps * np.maximum(nu2[:-1], nu2[1:]))])
    # nu^2 is a mean of n_probe squared norms of a Gaussian quadratic form, chi^2_k / k
    # distributed about its mean for k effective dimensions (k = 2 / CV^2); k = 1 is the most
    # likely to be underestimated.  k is estimated from the probes pooled over the records
    # (each normalised by its record's mean) and halved for that estimate's own error
    # (floor 1); the accumulated variance is replaced by its upper confidence bound at the
    # policy's tail probability: var <= var_hat N k / chi2_{N k}^{-1}(NU2_TAIL), N = the
    # n_probe (j + 1) probes behind record j.  (Measured, (2,), H = 1, L = 179, B = 32: the
    # probes' squared norms have median/mean 0.42 and max/mean 13 over 200 draws, i.e.
    # k ~ 1; with the plain mean of 2 probes one Hypothesis draw in ~40 exceeded the bound.)
    z = samples / np.maximum(nu2[:, None], 1e-300)
    cv2 = float(np.sum((z - 1.0) ** 2) / max(z.size - len(t), 1)) if n_probe > 1 else 2.0
    k_eff = max(1.0, 0.5 * 2.0 / max(cv2, 1e-12))
    n_used = n_probe * np.arange(1, len(t) + 1) * k_eff
    confidence = n_used / chi2.ppf(NU2_TAIL, n_used)
    var = var_hat * confidence
    r = np.asarray(cfg.tasks, float)[None, None, :]
    norm_D = np.sqrt(np.sum(r * omega ** 2, axis=(1, 2)) + np.sum(mu ** 2, axis=(1, 2)))
    rms = np.sqrt(var)
    # plus the rounding floor of the exact case (a random basis makes the start itself
    # decomposable only to rounding)
    floor = ROUNDING_PER_STEP * (np.rint(t / tcfg.lr) + 1) * _eps(cfg)
    return {"nu2": nu2, "rms": rms, "rms_point_estimate": np.sqrt(var_hat), "confidence_factor": confidence,
            "effective_dimensions": k_eff,
            "norm_D": norm_D, "floor": floor, "bound": Z_SE * rms / norm_D + floor}


def kicked_start(cfg, size: float = KICK, seed: int = 0) -> MultiHeadAttention:
    """cfg's decomposable start moved off D inside D_+ = {W_XX, U_Y unrestricted}: a random
    kick of relative size ``size`` on the X-X block of the QK weight (K for factored, W for
    merged) and on the Y block of the OV weight (O for factored, U for merged)."""
    model = MultiHeadAttention(cfg)
    d = cfg.d
    gen = torch.Generator().manual_seed(seed + 7)
    qk, ov = ("K", "O") if cfg.param == "factored" else ("W", "U")
    with torch.no_grad():
        for name, block in ((qk, (slice(None), slice(0, d), slice(0, d))), (ov, (slice(None), slice(None), slice(d, None)))):
            p = getattr(model, name)
            view = p[block]
            noise = torch.randn(view.shape, generator=gen, dtype=torch.float64).to(p)
            view += size * view.abs().max() * noise / noise.abs().max()
    return model


def check_structure_preserved(cfg, tcfg, n_probe: int = 4, check_random_full: bool = True) -> Comparison:
    """Train the full model (``numerics.train.train``, fresh batches) from cfg's decomposable
    init and compare its residual with the Monte-Carlo bound at every record; perturbations
    (broken structures held to the same bound): a ``random_full`` start and a start kicked
    into D_+ \\ D (:func:`kicked_start`, where d >= 2 or m >= 2)."""
    _check_start_in_D(cfg, "claim 1")
    res = train(cfg, tcfg)
    tr = trajectory_of(res)
    nb = noise_bound(cfg, tcfg, tr.t, tr.omega, tr.mu, n_probe)
    bound = nb["bound"]
    ratio = tr.residual / bound
    k = int(np.argmax(ratio))
    margin = float(ratio[k])
    perts = []
    details = {"config": cfg.to_dict(), "train": tcfg.to_dict(), "t": tr.t, "residual": tr.residual,
               "bound": bound, "rms_noise": nb["rms"], "rms_noise_point_estimate": nb["rms_point_estimate"],
               "confidence_factor": nb["confidence_factor"], "effective_dimensions": nb["effective_dimensions"],
               "nu2": nb["nu2"], "norm_D": nb["norm_D"],
               "se_at_worst": float(nb["rms"][k] / nb["norm_D"][k]),
               "bound_looseness": 1.0 / margin if margin > 0 else math.inf,
               "final_omega": tr.omega[-1], "final_mu": tr.mu[-1], "final_loss_tail": res.loss,
               "wall_seconds": res.wall_seconds}
    if cfg.d >= 2 or cfg.m >= 2:
        kicked = trajectory_of(train(cfg, tcfg, start=kicked_start(cfg, KICK, tcfg.seed))).residual
        perts.append(perturbation(f"fixed set D_+ = {{W_XX, U_Y unrestricted}}: a start kicked into D_+ \\ D "
                                  f"(relative {KICK:g}) held to the same bound", float(np.max(kicked / bound)), 1.0))
        details["residual_kicked_D_plus"] = kicked
    if check_random_full:
        rf = trajectory_of(train(cfg.replace(init="random_full", init_omega=None, init_mu=None), tcfg)).residual
        perts.append(perturbation("non-decomposable start (random_full) held to the same bound",
                                  float(np.max(rf / bound)), 1.0))
        details["residual_random_full"] = rf
    why = (f"{Z_SE:g} x rms of the accumulated off-D Monte-Carlo noise of the GD steps, measured "
           f"at each record with {n_probe} probe batches of size {tcfg.batch} (chi^2_1 tail at {Z_SE:g} rms; "
           "the estimate of nu^2 replaced by its upper confidence bound at the same tail), "
           "divided by ||P_D theta||; compared as residual/bound <= 1")
    return Comparison(
        name=(f"fresh-batch tasks={cfg.tasks} H={cfg.heads} L={cfg.L} sigma={cfg.sigma:g} {cfg.param} {cfg.basis} "
              f"B={tcfg.batch} lr={tcfg.lr} t={tcfg.time:g}"),
        measured=float(tr.residual[k]), predicted=float(bound[k]), error=margin, tolerance=1.0, why=why,
        perturbations=perts, details=details,
    )


# ---------------------------------------------------------------------------------------
# the claim run of the report
# ---------------------------------------------------------------------------------------

def _profile(profile) -> BlockStructureProfile:
    if isinstance(profile, BlockStructureProfile):
        return profile
    return PROFILES[check_profile(profile)]


def plan(prof: BlockStructureProfile, device: str = "cpu", seed: int = 0, problem: dict | None = None):
    """(exact cases, fresh cases, not_run): lists of (ProblemConfig, kwargs / TrainConfig) and
    the exact cases left out for cost (with the reason)."""
    tcfg = TrainConfig(lr=prof.lr, time=prof.time, batch=prof.batch, records=prof.records, seed=seed)
    if problem is not None:
        base = ProblemConfig(device=device, **dict(problem))
        exact_cfgs, fresh_cfgs = [base], [base]
    else:
        exact_cfgs = [ProblemConfig(tasks=tuple(t), heads=prof.exact_heads, L=prof.exact_L, sigma=prof.sigma,
                                    param=p, basis=b, device=device)
                      for t in prof.exact_tasks for p in prof.params for b in prof.bases]
        fresh_cfgs = [ProblemConfig(tasks=tuple(t), heads=prof.fresh_heads, L=prof.fresh_L, sigma=prof.sigma,
                                    param=p, basis=b, device=device)
                      for t in prof.fresh_tasks for p in prof.params for b in prof.bases]
    exact, not_run = [], []
    for cfg in exact_cfgs:
        tokens = group_order(cfg.tasks) * prof.exact_base_prompts * cfg.L
        if tokens > prof.max_exact_tokens:
            not_run.append({"case": f"symmetrised-exact tasks={cfg.tasks} L={cfg.L}",
                            "reason": f"|G| base_prompts L = {tokens} tokens > max_exact_tokens = "
                                      f"{prof.max_exact_tokens} (cost; the fresh-batch check still runs)"})
            continue
        exact.append((cfg, dict(lr=prof.lr, steps=prof.exact_steps, base_prompts=prof.exact_base_prompts)))
    return exact, [(cfg, tcfg) for cfg in fresh_cfgs], not_run


def run(profile="quick", device="cpu", seed=0, progress=no_progress, sweep=None, problem=None) -> ClaimResult:
    """Claim 1 on a profile (a name of PROFILES or a BlockStructureProfile): the exact-symmetry
    cases and the fresh-batch cases; with ``problem`` (ProblemConfig fields) both at that
    configuration, with the profile's step counts."""
    prof = _profile(profile)

    def body() -> ClaimResult:
        exact_cases, fresh_cases, not_run = plan(prof, device, seed, problem)
        n = len(exact_cases) + len(fresh_cases)
        comps: list[Comparison] = []
        for j, (cfg, kw) in enumerate(exact_cases):
            progress(f"{CLAIM_ID}: exact symmetric batch {j + 1}/{len(exact_cases)}", j / n)
            comps.append(check_symmetrised_exact(cfg, seed=seed, **kw))
        for j, (cfg, tcfg) in enumerate(fresh_cases):
            progress(f"{CLAIM_ID}: fresh batches {j + 1}/{len(fresh_cases)}", (len(exact_cases) + j) / n)
            comps.append(check_structure_preserved(cfg, tcfg, n_probe=prof.n_probe))
        progress(f"{CLAIM_ID}: done", 1.0)
        fresh = [c for c in comps if c.name.startswith("fresh")]
        exact = [c for c in comps if c.name.startswith("symmetrised")]
        headline = ([headline_row(c, "off-D residual on an exactly G-invariant batch: " + c.name[len("symmetrised-exact "):])
                     for c in exact]
                    + [headline_row(c, "off-D residual on fresh batches (bound = Z_SE x MC noise): "
                                    + c.name[len("fresh-batch "):], theory=0.0, tolerance=c.predicted,
                                    se=c.details["se_at_worst"]) for c in fresh])
        return comparisons_result(
            CLAIM_ID, TITLE, STATEMENT, comps, _figures(fresh, exact),
            {"profile": prof.__dict__ if not isinstance(profile, str) else profile, "seed": seed,
             "domain": {"condition": DOMAIN, "cases_in_domain": [c.name for c in comps], "cases_outside": []},
             "ran": {"problem": problem, "exact": [c.name for c in exact], "fresh": [c.name for c in fresh],
                     "not_run": not_run}},
            theory={"fixed_set": "D (commutant of the symmetry group; theory.block_structure)",
                    "exact_residual": 0.0, "fresh_bound": [c.predicted for c in fresh]},
            numerics={"exact_max_residual": [c.measured for c in exact],
                      "fresh_residual_at_worst": [c.measured for c in fresh],
                      "worst": worst(comps)},
            tolerance={"value": {"exact": [c.tolerance for c in exact], "fresh_ratio": 1.0},
                       "why": " | ".join(sorted({c.why.split(':')[0] for c in comps}))},
            headline=headline)

    return run_claim(CLAIM_ID, TITLE, STATEMENT, body)


def _figures(fresh: list, exact: list) -> list:
    figures = []
    if fresh:
        c = fresh[0]
        t = list(map(float, c.details["t"]))
        series = [Series("measured residual", t[1:], list(map(float, c.details["residual"][1:])), "points"),
                  Series(f"Monte-Carlo bound ({Z_SE:g} rms)", t[1:], list(map(float, c.details["bound"][1:])), "line")]
        for key, label in (("residual_random_full", "random_full start"),
                           ("residual_kicked_D_plus", "start kicked into D_+ \\ D")):
            if key in c.details:
                series.append(Series(label, t[1:], list(map(float, c.details[key][1:])), "dashed"))
        figures.append(Figure(name="block-structure-residual", title=f"off-D residual vs t ({c.name})", yscale="log",
                              xlabel="t", ylabel="||theta - P_D theta|| / ||theta||", series=series))
    if exact:
        c = exact[0]
        t = list(map(float, c.details["t"]))
        series = [Series("G-invariant batch", t, [max(float(v), 1e-18) for v in c.details["residual"]], "points"),
                  Series("one group element dropped", t[: len(c.details["residual_one_dropped"])],
                         [max(float(v), 1e-18) for v in c.details["residual_one_dropped"]], "points")]
        for keep, res in c.details["residual_wrong_group"].items():
            series.append(Series(f"symmetric under {keep} only", t[: len(res)], [max(float(v), 1e-18) for v in res],
                                 "points"))
        figures.append(Figure(name="block-structure-exact", title=f"exactly symmetric batch ({c.name})", yscale="log",
                              xlabel="t", ylabel="residual", series=series,
                              hlines=[{"y": c.tolerance, "label": "rounding tolerance"}]))
    return figures
