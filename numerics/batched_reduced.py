"""Many reduced flows of one shape as one tensor program: the engine behind
``numerics.train.train_reduced_many`` (issue 28, "many runs as one program"; issue 34).

R independent reduced flows (numerics.train.train_reduced, estimator "prompts") with the same
tasks, heads, L, parametrisation, basis, dtype, device and batch size (starts, metrics, logit
scales, seeds, sigma, learning rates, lengths and records may differ) are trained by one
gradient-descent loop whose tensors carry a leading run axis:

- the values of all runs stacked, omega and mu (R, H, m);
- the prompts of each distinct stream drawn once per step, (S, B, L, D), S <= R (runs that
  draw the same prompts -- same seed, sigma, symmetrize and fresh_batches -- share one draw,
  as in numerics.batched), and their block scores s_{l,j} = <Phi_j^T x_l, Phi_j^T q> and labels
  computed once per stream (numerics.reduced.block_scores on the stacked prompts);
- each run's batch loss (1/B) sum_b ||y_q - y_hat||^2 with y_hat_i = sum_h mu[h,i] sum_l p_hl
  y_{l,i}, p_h = softmax_l(sum_j omega[h,j] s_{l,j}) (numerics.reduced.predict_from_scores, the
  one prediction formula, applied with the runs folded into the batch axis);
- one backward pass of the sum of the runs' losses (they share no parameter: the gradient of
  the sum with respect to run r's values is that of run r's loss) and one update per run,
  omega_r -= lr_r f_omega(omega_r, mu_r) dL_r/domega_r, mu_r likewise, with run r's metric
  factors (its ``metric``, or numerics.reduced.metric_factors of its config).

Each run's numbers are those of the run trained alone by train_reduced to rounding (the same
prompts from its own stream, the same arithmetic with the runs on a batch axis), tested in
tests/test_train_reduced_rb.py.  A run leaves the program at its last step or when its loss
diverges (its entry is then the TrainingDiverged train_reduced would raise) or its on_record
hook raises (that exception); the others go on with the remaining runs selected again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from .batched import program_results, shape_key, stream_key
from .config import ProblemConfig, use_precise_float32
from .data import Prompts, make_generator, sample_prompts
from .model import initial_semi_singular_values
from .reduced import block_scores, metric_factors, predict_from_scores


@dataclass
class _Run:
    index: int
    cfg: ProblemConfig
    tcfg: object                   # numerics.train.TrainConfig
    stream: int
    record_at: set
    on_record: Optional[Callable]
    metric: Callable
    losses: torch.Tensor           # (steps + 1,) a row of the program's table
    trajectory: list
    error: Optional[BaseException] = None
    final: None = None             # a reduced flow hands back no model (program_results)


def _start_values(cfg: ProblemConfig, start) -> tuple[torch.Tensor, torch.Tensor]:
    """(omega0, mu0) as train_reduced reads them: cfg's decomposable start or ``start``, copied."""
    omega0, mu0 = initial_semi_singular_values(cfg) if start is None else start
    out = tuple(torch.as_tensor(np.asarray(v.detach().cpu() if torch.is_tensor(v) else v, dtype=float))
                .to(cfg.device, cfg.torch_dtype).clone() for v in (omega0, mu0))
    for name, v in zip(("omega0", "mu0"), out):
        if tuple(v.shape) != (cfg.heads, cfg.m):
            raise ValueError(f"start {name} must have shape (heads, m) = ({cfg.heads}, {cfg.m}), got {tuple(v.shape)}")
    return out


def stacked_reduced_losses(omega: torch.Tensor, mu: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor,
                           target: torch.Tensor, k: int) -> torch.Tensor:
    """Per-run batch losses (R,) of R = S k runs in stream-major order, k runs per stream: run r
    at (omega[r], mu[r]) (H, m) on stream r // k's scores, labels (S, B, L, m) and target
    (S, B, m).  numerics.reduced.predict_from_scores with the k runs' H heads of a stream read
    as k H heads: logits sum_j omega[h,j] s_{l,j} (one matmul per stream), softmax over l,
    c_h = sum_l p_hl y_l, y_hat_r = sum_h mu_rh c_rh."""
    S, B = scores.shape[:2]
    H, m = omega.shape[1:]
    om = omega.reshape(S, 1, k * H, m)
    logits = torch.matmul(om, scores.transpose(-1, -2))                   # (S, B, k H, L)
    c = torch.matmul(torch.softmax(logits, dim=-1), labels).view(S, B, k, H, m)
    pred = (mu.reshape(S, 1, k, H, m) * c).sum(dim=3)                      # (S, B, k, m)
    return ((pred - target[:, :, None]) ** 2).sum(dim=-1).mean(dim=1).reshape(S * k)


def run_reduced_program(cfgs: Sequence[ProblemConfig], tcfgs: Sequence, indices: Sequence[int], *,
                        start: Sequence, metric: Sequence, on_record: Sequence,
                        record_every: Sequence) -> dict:
    """Train the reduced flows ``indices`` (one shape_key, one batch size, no batch source, no
    checkpoint, estimator "prompts") as one program; returns {index: TrainResult, or the
    exception that ended the run}.  See the module docstring."""
    from .train import Record, divergence, diverged, record_steps   # train imports us lazily

    use_precise_float32()
    cfg0, B = cfgs[indices[0]], tcfgs[indices[0]].batch
    if len({shape_key(cfgs[i]) + (tcfgs[i].batch,) for i in indices}) != 1:
        raise ValueError("run_reduced_program: the runs must share one shape (numerics.batched.SHAPE_FIELDS) and batch")
    streams, keyed, runs, values = [], {}, [], []
    for i in indices:
        cfg, tcfg = cfgs[i], tcfgs[i]
        key = stream_key(cfg, tcfg)
        if key not in keyed:
            keyed[key] = len(streams)
            gen = make_generator(tcfg.seed, cfg.device)
            fixed = None if tcfg.fresh_batches else sample_prompts(cfg, B, gen, tcfg.symmetrize)
            streams.append((cfg, tcfg.symmetrize, gen, fixed))
        f = metric[i] if metric[i] is not None else (lambda o, m_, cfg=cfg: metric_factors(o, m_, cfg))
        runs.append(_Run(i, cfg, tcfg, keyed[key], record_steps(tcfg, record_every[i]), on_record[i], f,
                         losses=None, trajectory=[]))
        values.append(_start_values(cfg, start[i]))
    n_max = max(r.tcfg.steps for r in runs)
    table = torch.zeros(len(runs), n_max + 1, dtype=cfg0.torch_dtype, device=cfg0.device)
    for a, r in enumerate(runs):
        r.losses = table[a, :r.tcfg.steps + 1]
    opts = dict(dtype=cfg0.torch_dtype, device=cfg0.device)
    buffer = Prompts(context=torch.empty(len(streams), B, cfg0.L, cfg0.token_dim, **opts),
                     query=torch.empty(len(streams), B, cfg0.token_dim, **opts),
                     target=torch.empty(len(streams), B, cfg0.m, **opts))
    for s, (_, _, _, fixed) in enumerate(streams):
        if fixed is not None:
            for name in ("context", "query", "target"):
                getattr(buffer, name)[s].copy_(getattr(fixed, name))
    order = sorted(range(len(runs)), key=lambda a: (runs[a].stream, a))   # stream-major
    omega = torch.stack([values[a][0] for a in order]).requires_grad_(True)
    mu = torch.stack([values[a][1] for a in order]).requires_grad_(True)

    def pack(active):
        """The stack's rows (positions in `runs`, stream-major), the slot of stream each reads
        (one per live stream with k runs each, or one per run when the streams hold different
        numbers of runs: k = 1, a stream's scores copied per run) and the runs' steps."""
        counts: dict = {}
        for a in active:
            counts[runs[a].stream] = counts.get(runs[a].stream, 0) + 1
        uniform = len(set(counts.values())) == 1
        slots = sorted(counts) if uniform else [runs[a].stream for a in active]
        k = next(iter(counts.values())) if uniform else 1
        whole = slots == list(range(len(streams)))
        return (active, torch.as_tensor(active, dtype=torch.long, device=cfg0.device),
                None if whole else torch.as_tensor(slots, dtype=torch.long, device=cfg0.device), k,
                torch.tensor([runs[a].tcfg.lr for a in active], **opts).view(-1, 1, 1))

    active, rows, slots, k, lr = pack(order)
    t0, cpu0 = time.perf_counter(), time.process_time()
    for step in range(n_max + 1):
        live = sorted({runs[a].stream for a in active})
        for s in live:                     # a stream no run reads any more is not drawn
            cfg_s, sym, gen, fixed = streams[s]
            if fixed is None:
                sample_prompts(cfg_s, B, gen, sym, out=Prompts(buffer.context[s], buffer.query[s], buffer.target[s]))
        scores, labels = block_scores(buffer, cfg0)                    # (S, B, L, m) each, once per stream
        target = buffer.target
        if slots is not None:
            scores, labels, target = (x.index_select(0, slots) for x in (scores, labels, target))
        per_run = stacked_reduced_losses(omega, mu, scores, labels, target, k)
        vals = per_run.detach()
        table[rows, step] = vals
        host = vals.tolist()
        leaving = set()
        for j, a in enumerate(active):
            r = runs[a]
            if diverged(host[j], r.tcfg):
                r.error = divergence(step, host[j], r.cfg, r.tcfg)
                leaving.add(j)
                continue
            if step in r.record_at:
                om, m_ = omega[j].detach(), mu[j].detach()
                r.trajectory.append(Record(t=step * r.tcfg.lr, loss=host[j], omega=om.cpu().double().tolist(),
                                           mu=m_.cpu().double().tolist(), residual=0.0))
                if r.on_record is not None:
                    try:
                        r.on_record(step, step * r.tcfg.lr, (om.clone(), m_.clone()), host[j])
                    except Exception as exc:           # ends this run as it would end train_reduced
                        r.error = exc
                        leaving.add(j)
                        continue
            if step == r.tcfg.steps:
                leaving.add(j)
        if len(leaving) == len(active):
            break
        g_om, g_mu = torch.autograd.grad(per_run.sum(), [omega, mu])
        with torch.no_grad():
            om_d, mu_d = omega.detach(), mu.detach()
            factors = [runs[a].metric(om_d[j], mu_d[j]) for j, a in enumerate(active)]
            omega.sub_(lr * torch.stack([f[0] for f in factors]) * g_om)
            mu.sub_(lr * torch.stack([f[1] for f in factors]) * g_mu)
        if leaving:
            keep = [j for j in range(len(active)) if j not in leaving]
            idx = torch.as_tensor(keep, dtype=torch.long, device=cfg0.device)
            omega = omega.detach().index_select(0, idx).requires_grad_(True)
            mu = mu.detach().index_select(0, idx).requires_grad_(True)
            active, rows, slots, k, lr = pack([active[j] for j in keep])
    return program_results(runs, time.perf_counter() - t0, time.process_time() - cpu0, "reduced")
