"""Many runs of one shape as one tensor program: the engine behind ``numerics.train.train_many``.

R independent runs of the full model with the same tasks, heads, L, parametrisation, basis,
dtype, device and batch size (seeds, starts, init scales, learning rates, sigma, lengths and
records may differ) are trained by one gradient-descent loop whose tensors carry a leading
run axis:

- the parameters of all runs stacked, (R, H, D, D) and (R, H, m, D) (:class:`StackedAttention`);
- the prompts of each distinct stream once, (S, B, L, D), S <= R: runs that draw the same
  prompts (same seed, sigma, batch source) share one draw, so a sweep over init scales,
  starts or learning rates at one seed samples once per step, not R times;
- the readout of every run in the same few batched matmuls: with k runs per stream, the
  k H heads of a stream's runs read its context together (one bmm for the logits and one for
  the weighted context over all S B prompts), exactly the per-run model of
  numerics.model.MultiHeadAttention.forward with heads and runs folded into one axis;
- one backward pass of the sum of the per-run losses (the runs share no parameter, so the
  gradient of the sum with respect to run r's weights is the gradient of run r's loss) and
  one update, each run with its own step lr_r.

Each run's numbers are those of the run trained alone by numerics.train.train to rounding
(the same prompts from its own stream, the same arithmetic in a different kernel order),
tested in tests/test_numerics_batched.py.  Why stacking and not torch.func.vmap (measured,
one thread, forward + backward of 8 runs, tasks 2,2, H = 2, float64, CPU ms; docs/
performance.md): at L = 32, batch 512, on one shared batch vmap(grad) took 24.0 against 6.2
stacked (vmap expands the shared context per run; 16.6 the runs one after another), on 8
batches of their own 13.3 against 10.2; at L = 64, batch 1024: 64.7 / 12.5 and 32.3 / 21.2.

A run leaves the program when it ends (its last step), when its loss diverges (its result
is the TrainingDiverged that train() would raise, the others go on) or when its on_record
hook raises (the exception is its result, as train() would have raised it); the remaining
runs are packed again (a copy of their parameters, rare).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from tqdm.auto import tqdm

from .config import ProblemConfig, use_precise_float32
from .data import Prompts, make_generator, sample_prompts
from .model import MultiHeadAttention, readout

FACTORED = ("K", "Q", "V", "O")
MERGED = ("W", "U")

SHAPE_FIELDS = ("tasks", "heads", "L", "param", "basis", "basis_seed", "dtype", "device")
"""The ProblemConfig fields that fix a program's tensor shapes and arithmetic: runs that agree
on them (and on the batch size) can share one program; every other field (sigma, init,
init_scale, init_seed, init_omega, init_mu, logit_scale) may differ from run to run."""


def shape_key(cfg: ProblemConfig) -> tuple:
    return tuple(getattr(cfg, f) for f in SHAPE_FIELDS)


class StackedAttention:
    """The weights of R runs of MultiHeadAttention of one shape on a leading run axis, and
    their readouts.  ``params``: name -> (R, ...) leaf tensor (K, Q, V, O or W, U);
    ``scale``: (R, 1, 1, 1) logit scales s_r (factored)."""

    def __init__(self, cfgs: Sequence[ProblemConfig], params: dict):
        self.cfgs = list(cfgs)
        cfg0 = self.cfgs[0]
        self.names = FACTORED if cfg0.param == "factored" else MERGED
        self.params = params
        self.scale = torch.tensor([c.logit_scale for c in self.cfgs], dtype=cfg0.torch_dtype,
                                  device=cfg0.device).view(-1, 1, 1, 1)

    @classmethod
    def from_models(cls, models: Sequence[MultiHeadAttention]) -> "StackedAttention":
        """The runs' current weights, copied into stacked tensors."""
        names = FACTORED if models[0].cfg.param == "factored" else MERGED
        params = {n: torch.stack([getattr(m, n).detach() for m in models]).requires_grad_(True) for n in names}
        return cls([m.cfg for m in models], params)

    @property
    def runs(self) -> int:
        return len(self.cfgs)

    def select(self, keep: Sequence[int]) -> "StackedAttention":
        """The runs ``keep`` (positions in this stack), in that order, as a new stack."""
        idx = torch.as_tensor(list(keep), dtype=torch.long, device=self.params[self.names[0]].device)
        return StackedAttention([self.cfgs[i] for i in keep],
                                {n: p.detach().index_select(0, idx).requires_grad_(True)
                                 for n, p in self.params.items()})

    def weights(self, r: int) -> dict:
        """Run r's parameters (views of the stack)."""
        return {n: p[r] for n, p in self.params.items()}

    def model(self, r: int) -> MultiHeadAttention:
        """Run r as a MultiHeadAttention holding a copy of its current weights."""
        return MultiHeadAttention.from_parameters(self.cfgs[r], **{n: p[r].detach().clone()
                                                                   for n, p in self.params.items()})

    def merged_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W (R, H, D, D) = K^T Q / s_r and U (R, H, m, D) = O V (or the trained W, U)."""
        p = self.params
        if "W" in p:
            return p["W"], p["U"]
        return torch.matmul(p["K"].transpose(-1, -2), p["Q"]) / self.scale, torch.matmul(p["O"], p["V"])

    def readout(self, r: int, merged: Optional[tuple] = None):
        """Run r's Readout (numerics.model.readout, the one readout), from ``merged`` =
        merged_weights() when given (one product for all the runs recording at a step)."""
        W, U = merged if merged is not None else self.merged_weights()
        return readout(self.cfgs[r], W[r], U[r])

    def losses(self, context: torch.Tensor, query: torch.Tensor, target: torch.Tensor, k: int) -> torch.Tensor:
        """Per-run batch losses (R,) = mean over the batch of ||y_q - y_hat||^2, the runs in
        stream-major order with ``k`` runs per stream: run r reads stream r // k of context
        (S, B, L, D), query (S, B, D), target (S, B, m), S = R / k.

        The readout of numerics.model.MultiHeadAttention.forward with the k runs' H heads of
        a stream as k H heads: a_g = W_g[:, :d] q, logits z_l^T a_g over the context (one bmm
        for all S B prompts), softmax over l, c_g = sum_l p_gl z_l, y_hat_r = sum_h U_rh c_rh."""
        S, B, L, D = context.shape
        cfg = self.cfgs[0]
        d, m, H = cfg.d, cfg.m, cfg.heads
        W, U = self.merged_weights()
        # a: (S, B, k H D) = q (S, B, d) @ W[..., :d]^T, the runs of stream s in order
        A = W[..., :d].reshape(S, k * H * D, d)
        a = torch.matmul(query[..., :d], A.transpose(1, 2)).view(S * B, k * H, D)
        ctx = context.view(S * B, L, D)
        # (S B, k H, L): the softmax over the last, contiguous axis (as in the model)
        p = torch.softmax(torch.bmm(a, ctx.transpose(1, 2)), dim=-1)
        c = torch.bmm(p, ctx).view(S, B, k, H * D)
        # y_hat[s, j, b] = sum_(h, i) U[run (s, j), h, :, i] c[s, b, (j, h), i]
        Uf = U.transpose(1, 2).reshape(S, k, m, H * D)
        pred = torch.einsum("sbjx,sjmx->sjbm", c, Uf)
        return ((pred - target[:, None]) ** 2).sum(dim=-1).mean(dim=-1).reshape(S * k)


@dataclass
class Run:
    """One run of a program: its configuration, its stream, its record steps and what it has
    produced so far."""
    index: int                     # position in train_many's arguments
    cfg: ProblemConfig
    tcfg: object                   # numerics.train.TrainConfig
    stream: int                    # index into the program's streams
    record_at: set
    on_record: Optional[Callable]
    start: Optional[MultiHeadAttention]
    losses: torch.Tensor           # (steps + 1,) batch losses: a row of the program's table
    trajectory: list
    checked: int = 0               # losses[:checked] have passed the divergence rule
    final: Optional[MultiHeadAttention] = None
    error: Optional[BaseException] = None


@dataclass
class Stream:
    """A source of one batch per step shared by the runs that read it: a fresh stream (its own
    generator, as train() draws it), a fixed batch, or a run's own ``batches`` callable."""
    cfg: ProblemConfig             # the problem the prompts are drawn for (sigma included)
    symmetrize: bool
    generator: Optional[torch.Generator] = None
    fixed: Optional[Prompts] = None
    source: Optional[Callable] = None


def stream_key(cfg: ProblemConfig, tcfg) -> tuple:
    """Runs of one shape_key and batch size with equal keys draw the same prompts (train()'s
    stream: make_generator(seed) and sample_prompts of cfg, which reads sigma, and symmetrize;
    a fixed batch when not fresh_batches)."""
    return (tcfg.seed, cfg.sigma, tcfg.symmetrize, tcfg.fresh_batches)


MERGE_CONTEXT_ELEMENTS = 2 ** 20
"""On the CPU, runs of different prompt streams share a program only while the program's
contexts (streams x batch x L x (d + m)) hold at most this many numbers (8 MiB in float64).
Measured (one thread, 8 runs of 8 own streams against the 8 runs one after another, CPU time,
float64, H = 2; docs/performance.md): 1.49x at tasks 3,3, L = 32, batch 256 (8 streams: 0.5 M
numbers), 1.29x at tasks 2,2, L = 32, batch 512 (0.8 M), but 1.09x at tasks 3,3, L = 64,
batch 512 (2.1 M) and 0.9-1.0x at tasks 2,2, L = 64, batch 1024 (5 streams a program: 2 M):
beyond about a million numbers the merged contexts leave the cache and merging gains
nothing, so larger streams get programs of their own (their runs still share their draw)."""


class _Layout:
    """Which run sits where in the stack and which stream each buffer slot holds: stream-major
    with k runs per slot when every stream has k runs (S = R / k slots), else one slot per run
    (a stream read by several such runs is drawn once and copied)."""

    def __init__(self, runs: list, active: Sequence[int], cfg: ProblemConfig, batch: int):
        by_stream: dict = {}
        for a in active:
            by_stream.setdefault(runs[a].stream, []).append(a)
        counts = {len(v) for v in by_stream.values()}
        if len(counts) == 1:
            self.k = counts.pop()
            self.order = [a for s in sorted(by_stream) for a in by_stream[s]]
            self.slots = sorted(by_stream)
        else:
            self.k = 1
            self.order = sorted(active, key=lambda a: (runs[a].stream, a))
            self.slots = [runs[a].stream for a in self.order]
        opts = dict(dtype=cfg.torch_dtype, device=cfg.device)
        n = len(self.slots)
        self.buffer = Prompts(context=torch.empty(n, batch, cfg.L, cfg.token_dim, **opts),
                              query=torch.empty(n, batch, cfg.token_dim, **opts),
                              target=torch.empty(n, batch, cfg.m, **opts))
        self.held = [None] * n     # what a slot last copied (a fixed batch is copied once)

    def slot(self, j: int) -> Prompts:
        b = self.buffer
        return Prompts(b.context[j], b.query[j], b.target[j])

    def fill(self, streams: list, step: int, batch: int) -> None:
        """Every slot's batch of this step: fresh streams drawn into it (once per stream),
        fixed batches and batch sources copied -- a source's batch only when it is not the
        very tensors, unchanged, that the slot holds already (the probes' fixed batches)."""
        drawn: dict = {}
        for j, s in enumerate(self.slots):
            st, view = streams[s], self.slot(j)
            if s in drawn:
                pr = drawn[s]
            elif st.generator is not None:
                drawn[s] = sample_prompts(st.cfg, batch, st.generator, st.symmetrize, out=view)
                continue
            else:
                pr = drawn[s] = st.fixed if st.fixed is not None else st.source(step)
            if st.generator is not None:                 # a copy of this step's draw (ragged layout)
                held = None
            else:   # the source's batch itself (kept alive: its memory cannot be reused) and its
                    # tensors' version counters (an in-place change of them is seen)
                held = (pr, tuple(t._version for t in (pr.context, pr.query, pr.target)))
            old = self.held[j]
            if held is None or old is None or old[0] is not pr or old[1] != held[1]:
                for name in ("context", "query", "target"):
                    getattr(view, name).copy_(getattr(pr, name))
                self.held[j] = held


def run_program(cfgs: Sequence[ProblemConfig], tcfgs: Sequence, indices: Sequence[int], *,
                batches: Sequence[Optional[Callable]], on_record: Sequence[Optional[Callable]],
                record_every: Sequence[Optional[int]], start: Sequence[Optional[MultiHeadAttention]]) -> dict:
    """Train the runs ``indices`` (one shape_key, one batch size) as one program; returns
    {index: TrainResult, or the exception that ended the run}.  See the module docstring."""
    from .train import Record, divergence, diverged, record_steps   # train imports us lazily

    use_precise_float32()
    cfg0, B = cfgs[indices[0]], tcfgs[indices[0]].batch
    streams: list[Stream] = []
    keyed: dict = {}
    runs: list[Run] = []
    for i in indices:
        cfg, tcfg = cfgs[i], tcfgs[i]
        if batches[i] is not None:
            s = len(streams)
            streams.append(Stream(cfg, tcfg.symmetrize, source=batches[i]))
        else:
            key = stream_key(cfg, tcfg)
            if key not in keyed:
                keyed[key] = len(streams)
                if tcfg.fresh_batches:
                    streams.append(Stream(cfg, tcfg.symmetrize, generator=make_generator(tcfg.seed, cfg.device)))
                else:                                       # train(): one batch from the seed's generator
                    streams.append(Stream(cfg, tcfg.symmetrize, fixed=sample_prompts(
                        cfg, B, make_generator(tcfg.seed, cfg.device), tcfg.symmetrize)))
            s = keyed[key]
        runs.append(Run(i, cfg, tcfg, s, record_steps(tcfg, record_every[i]), on_record[i], start[i],
                        losses=None, trajectory=[]))
    n_max = max(r.tcfg.steps for r in runs)
    table = torch.zeros(len(runs), n_max + 1, dtype=cfg0.torch_dtype, device=cfg0.device)
    for a, r in enumerate(runs):
        r.losses = table[a, :r.tcfg.steps + 1]
    lay = _Layout(runs, range(len(runs)), cfg0, B)
    state = StackedAttention.from_models([r.start if r.start is not None else MultiHeadAttention(r.cfg)
                                          for r in (runs[a] for a in lay.order)])
    check_every = 1 if cfg0.torch_device.type == "cpu" else 50   # as train(): a sync per step is free on CPU

    def pack(order):
        """The stack's run positions, as an index, and their steps lr_r, shaped for the update."""
        return (order, torch.as_tensor(order, dtype=torch.long, device=cfg0.device),
                torch.tensor([runs[a].tcfg.lr for a in order], dtype=cfg0.torch_dtype, device=cfg0.device))

    active, rows, lr = pack(lay.order)   # positions in `runs` of the stack's runs, in stack order

    def first_divergence(r: Run, upto: int):
        vals = r.losses[r.checked:upto + 1].cpu().tolist()
        for kk, v in enumerate(vals, start=r.checked):
            if diverged(v, r.tcfg):
                return divergence(kk, v, r.cfg, r.tcfg)
        r.checked = upto + 1
        return None

    t0, cpu0 = time.perf_counter(), time.process_time()
    bar = tqdm(total=n_max, disable=not any(r.tcfg.progress for r in runs), desc=f"GD, {len(runs)} runs",
               unit="step")
    try:
        for step in range(n_max + 1):
            lay.fill(streams, step, B)
            per_run = state.losses(lay.buffer.context, lay.buffer.query, lay.buffer.target, lay.k)
            vals = per_run.detach()
            table[rows, step] = vals
            host = vals.tolist() if check_every == 1 else None
            leaving, merged = set(), None
            for j, a in enumerate(active):
                r = runs[a]
                ends, records = step == r.tcfg.steps, step in r.record_at
                if host is not None:
                    r.error = divergence(step, host[j], r.cfg, r.tcfg) if diverged(host[j], r.tcfg) else None
                elif step % check_every == 0 or ends or records:
                    r.error = first_divergence(r, step)
                if r.error is not None:
                    leaving.add(j)
                    continue
                if records:
                    try:
                        if merged is None:
                            with torch.no_grad():
                                merged = state.merged_weights()
                        ro = state.readout(j, merged)
                        loss = host[j] if host is not None else float(vals[j])
                        r.trajectory.append(Record(t=step * r.tcfg.lr, loss=loss, omega=ro.omega.tolist(),
                                                   mu=ro.mu.tolist(), residual=float(ro.residual)))
                        if r.on_record is not None:
                            r.on_record(step, step * r.tcfg.lr, state.model(j), loss)
                    except Exception as exc:               # ends this run as it would end train()
                        r.error = exc
                        leaving.add(j)
                        continue
                if ends:
                    r.final = r.start if r.start is not None else state.model(j)
                    leaving.add(j)
            for j in leaving:
                r = runs[active[j]]
                if r.start is not None:   # train() trains a start model in place: it holds the weights
                    with torch.no_grad():  # at the run's end, or where an error stopped it
                        for n, v in state.weights(j).items():
                            getattr(r.start, n).copy_(v)
            if len(leaving) == len(active):
                break
            # one backward pass of the summed losses and one update (runs leaving now take it
            # too, uselessly: it is cheaper than packing the stack again first)
            grads = torch.autograd.grad(per_run.sum(), [state.params[n] for n in state.names])
            with torch.no_grad():
                for n, g in zip(state.names, grads):
                    state.params[n].sub_(lr.view(-1, *([1] * (g.dim() - 1))) * g)
            if leaving:
                keep = [a for j, a in enumerate(active) if j not in leaving]
                pos = {a: j for j, a in enumerate(active)}
                lay = _Layout(runs, keep, cfg0, B)
                state = state.select([pos[a] for a in lay.order])
                active, rows, lr = pack(lay.order)
            bar.update(1)
    finally:
        bar.close()
    return program_results(runs, time.perf_counter() - t0, time.process_time() - cpu0, "full")


def program_results(runs: list, wall: float, cpu: float, kind: str) -> dict:
    """A program's results split per run (numerics.batched and numerics.batched_reduced):
    {index: the exception that ended the run, or its TrainResult (numerics.train.make_result of
    its records, its batch losses and its final model, kind ``kind``)}; each run's wall and CPU
    seconds are its part of the program's ``wall`` and ``cpu``: its share of the steps."""
    from .train import make_result   # train imports us lazily

    total = sum(r.tcfg.steps for r in runs)
    out = {}
    for r in runs:
        if r.error is not None:
            out[r.index] = r.error
            continue
        share = r.tcfg.steps / total
        out[r.index] = make_result(r.cfg, r.tcfg, r.trajectory, r.losses[:r.tcfg.steps].cpu().double().numpy(),
                                   wall * share, cpu * share, kind, r.final, batched_runs=len(runs))
    return out
