"""The one gradient-descent loop of numerics: R runs of one shape as one tensor program.

Every run of numerics.train (``train``, ``train_reduced``, ``train_many``,
``train_reduced_many``) is a run of this program; a single run is a program of one run.
The runs' state carries a leading run axis:

- the full model (:class:`StackedAttention`): the weights of all runs stacked, (R, H, D, D)
  and (R, H, m, D); with k runs per stream, the k H heads of a stream's runs read its context
  together (one bmm for the logits and one for the weighted context over all S B prompts),
  exactly numerics.model.MultiHeadAttention.forward with heads and runs folded into one axis;
  each run moves by plain GD, theta_r -= lr_r grad L_r;
- the reduced flow (:class:`StackedValues`): the semi-singular values stacked, omega and mu
  (R, H, m), the loss numerics.reduced.predict_from_scores's formula with the runs' heads on
  one axis (or, estimator "marginal", numerics.exact_reduced.marginal_mean_loss per run); each
  run moves with its metric factors, omega_r -= lr_r f_omega(omega_r, mu_r) dL_r/domega_r,
  mu_r likewise.

The prompts of each distinct stream are drawn once per step, (S, B, L, D), S <= R: runs that
draw the same prompts (same seed, sigma, symmetrize and fresh_batches, no batch source of
their own) share one draw.  One backward pass of the sum of the per-run losses (the runs share
no parameter, so the gradient of the sum with respect to run r's state is that of run r's
loss) and one update.  Why stacking and not torch.func.vmap (measured, one thread, forward +
backward of 8 runs, tasks 2,2, H = 2, float64, CPU ms; docs/performance.md): at L = 32, batch
512, on one shared batch vmap(grad) took 24.0 against 6.2 stacked (vmap expands the shared
context per run; 16.6 the runs one after another), on 8 batches of their own 13.3 against
10.2; at L = 64, batch 1024: 64.7 / 12.5 and 32.3 / 21.2.

A run leaves the program at its last step, when its batch loss diverges (its result is the
TrainingDiverged naming step, time and loss) or when its on_record hook raises (that
exception); the remaining runs are packed again (a copy of their state, rare).  A program of
one run may be checkpointed (:class:`_Checkpoint`): a resumed run ends bit-identical to the
run uninterrupted.  Each run's :func:`fingerprint`-s (its first batch, its initial state)
make its independence from the other runs a checked fact (numerics.seeds.check_independent).
"""
from __future__ import annotations

import io
import math
import os
import time
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Callable, Optional, Sequence

import torch
from tqdm.auto import tqdm

from numerics.io import write_output

from . import checkpoint
from .config import ProblemConfig, use_precise_float32
from .data import STREAM_VERSION, Prompts, make_generator
from .exact_reduced import MarginalPrompts, marginal_mean_loss
from .model import MultiHeadAttention, TrainingDiverged, attend, readout
from .reduced import block_scores
from .seeds import digest

FACTORED = ("K", "Q", "V", "O")
MERGED = ("W", "U")

SHAPE_FIELDS = ("tasks", "heads", "L", "param", "basis", "basis_seed", "dtype", "device")
"""The ProblemConfig fields that fix a program's tensor shapes and arithmetic: runs that agree
on them (and on the batch size) can share one program; every other field (sigma, init,
init_scale, init_seed, init_omega, init_mu, logit_scale) may differ from run to run."""

def shape_key(cfg: ProblemConfig) -> tuple:
    return tuple(getattr(cfg, f) for f in SHAPE_FIELDS)


def stream_key(cfg: ProblemConfig, tcfg) -> tuple:
    """Runs of one shape_key and batch size with equal keys draw the same prompts (the stream
    make_generator(seed) and the sampler of cfg, which reads sigma, and symmetrize; a fixed
    batch when not fresh_batches)."""
    return (tcfg.seed, cfg.sigma, tcfg.symmetrize, tcfg.fresh_batches)


@dataclass
class Record:
    t: float
    loss: float
    omega: list
    mu: list
    residual: float


def diverged(loss: float, tcfg) -> bool:
    """The divergence rule: a batch loss that is not finite or exceeds ``tcfg.diverge_loss``."""
    return not math.isfinite(loss) or loss > tcfg.diverge_loss


def divergence(step: int, loss: float, cfg: ProblemConfig, tcfg) -> TrainingDiverged:
    """The error of a run whose batch loss at ``step`` broke the rule of :func:`diverged`."""
    why = "non-finite" if not math.isfinite(loss) else f"above diverge_loss = {tcfg.diverge_loss:g}"
    return TrainingDiverged(f"training diverged at step {step} (t = {step * tcfg.lr:.6g}): batch loss {loss!r} "
                            f"({why}); lower the learning rate (lr = {tcfg.lr:g}) or the initial scale "
                            f"(init_scale = {cfg.init_scale:g})")


def fingerprint(*items) -> str:
    """numerics.seeds.digest of tensors (a Prompts or MarginalPrompts stands for its fields)."""
    flat = [t for x in items for t in ([getattr(x, f.name) for f in fields(x)] if is_dataclass(x) else [x])]
    return digest(*(t.detach().to("cpu", torch.float64).numpy() for t in flat))


class StackedAttention:
    """The weights of R runs of MultiHeadAttention of one shape on a leading run axis, and
    their readouts.  ``params``: name -> (R, ...) leaf tensor (K, Q, V, O or W, U);
    ``scale``: (R, 1, 1, 1) logit scales s_r (factored)."""
    kind = "full"

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

    @classmethod
    def from_runs(cls, runs: Sequence["Run"]) -> "StackedAttention":
        return cls.from_models([r.start if r.start is not None else MultiHeadAttention(r.cfg) for r in runs])

    def select(self, keep: Sequence[int]) -> "StackedAttention":
        """The runs ``keep`` (positions in this stack), in that order, as a new stack."""
        idx = torch.as_tensor(list(keep), dtype=torch.long, device=self.params[self.names[0]].device)
        return StackedAttention([self.cfgs[i] for i in keep],
                                {n: p.detach().index_select(0, idx).requires_grad_(True)
                                 for n, p in self.params.items()})

    @property
    def tensors(self) -> list:
        return [self.params[n] for n in self.names]

    def run_tensors(self, r: int) -> list:
        """Run r's parameters (views of the stack), in the model's parameter order."""
        return [self.params[n][r] for n in self.names]

    def model(self, r: int) -> MultiHeadAttention:
        """Run r as a MultiHeadAttention holding a copy of its current weights."""
        return MultiHeadAttention.from_parameters(self.cfgs[r], **{n: p[r].detach().clone()
                                                                   for n, p in self.params.items()})

    hook_state = model

    def merged_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W (R, H, D, D) = K^T Q / s_r and U (R, H, m, D) = O V (or the trained W, U)."""
        p = self.params
        if "W" in p:
            return p["W"], p["U"]
        return torch.matmul(p["K"].transpose(-1, -2), p["Q"]) / self.scale, torch.matmul(p["O"], p["V"])

    def readout(self, r: int, cache: dict):
        """Run r's (omega, mu, residual) by numerics.model.readout, the one readout; the merged
        weights of all runs formed once per ``cache`` (one per step)."""
        if "merged" not in cache:
            with torch.no_grad():
                cache["merged"] = self.merged_weights()
        W, U = cache["merged"]
        ro = readout(self.cfgs[r], W[r], U[r])
        return ro.omega.tolist(), ro.mu.tolist(), float(ro.residual)

    def losses(self, prompts: Prompts, k: int) -> torch.Tensor:
        """Per-run batch losses (R,) = mean over the batch of ||y_q - y_hat||^2, the runs in
        stream-major order with ``k`` runs per stream: run r reads stream r // k of context
        (S, B, L, D), query (S, B, D), target (S, B, m), S = R / k.

        The readout of numerics.model.MultiHeadAttention.forward with the k runs' H heads of
        a stream as k H heads: a_g = W_g[:, :d] q, logits z_l^T a_g over the context (one bmm
        for all S B prompts), softmax over l, c_g = sum_l p_gl z_l, y_hat_r = sum_h U_rh c_rh."""
        S = prompts.context.shape[0]
        return ((self.predictions(prompts, k) - prompts.target[:, None]) ** 2).sum(dim=-1).mean(dim=-1).reshape(S * k)

    def prompt_losses(self, prompts: Prompts) -> torch.Tensor:
        """Per-run per-prompt losses (R, B) ||y_q - y_hat||^2 of every run on the one batch
        ``prompts`` (context (B, L, D), query (B, D), target (B, m)): numerics.evaluate.
        prompt_losses of each run's model, to float rounding, as one program."""
        one = Prompts(prompts.context[None], prompts.query[None], prompts.target[None])
        R = len(self.cfgs)
        return ((self.predictions(one, R) - one.target[:, None]) ** 2).sum(dim=-1).reshape(R, -1)

    def predictions(self, prompts: Prompts, k: int) -> torch.Tensor:
        """y_hat (S, k, B, m) of the runs in stream-major order, ``k`` runs per stream (:meth:`losses`)."""
        context, query = prompts.context, prompts.query
        S, B, L, D = context.shape
        d, m, H = self.cfgs[0].d, self.cfgs[0].m, self.cfgs[0].heads
        W, U = self.merged_weights()
        # a: (S, B, k H D) = q (S, B, d) @ W[..., :d]^T, the runs of stream s in order
        A = W[..., :d].reshape(S, k * H * D, d)
        a = torch.matmul(query[..., :d], A.transpose(1, 2)).view(S * B, k * H, D)
        ctx = context.reshape(S * B, L, D)
        c = attend(a, ctx).view(S, B, k, H * D)
        # y_hat[s, j, b] = sum_(h, i) U[run (s, j), h, :, i] c[s, b, (j, h), i]
        Uf = U.transpose(1, 2).reshape(S, k, m, H * D)
        return torch.einsum("sbjx,sjmx->sjbm", c, Uf)

    def step(self, grads, lr: torch.Tensor) -> None:
        for n, g in zip(self.names, grads):
            self.params[n].sub_(lr.view(-1, *([1] * (g.dim() - 1))) * g)

    def leave(self, run: "Run", r: int) -> None:
        """A start model is trained in place: it holds the weights where its run stopped."""
        if run.start is not None:
            with torch.no_grad():
                for n, p in self.params.items():
                    getattr(run.start, n).copy_(p[r])
        run.final = run.start if run.start is not None else self.model(r) if run.error is None else None


class StackedValues:
    """The semi-singular values of R reduced flows of one shape, omega and mu (R, H, m) leaf
    tensors, each run with its metric (f_omega, f_mu) = metric(omega_r, mu_r)."""
    kind = "reduced"

    def __init__(self, cfgs, omega: torch.Tensor, mu: torch.Tensor, metrics: list, marginal: bool):
        self.cfgs, self.omega, self.mu, self.metrics, self.marginal = list(cfgs), omega, mu, metrics, marginal

    @classmethod
    def from_runs(cls, runs: Sequence["Run"]) -> "StackedValues":
        """``run.start``: (omega0, mu0) tensors of the run's dtype and device (copied here)."""
        omega, mu = (torch.stack([r.start[i] for r in runs]).requires_grad_(True) for i in (0, 1))
        return cls([r.cfg for r in runs], omega, mu, [r.metric for r in runs], runs[0].estimator == "marginal")

    def select(self, keep: Sequence[int]) -> "StackedValues":
        idx = torch.as_tensor(list(keep), dtype=torch.long, device=self.omega.device)
        omega, mu = (v.detach().index_select(0, idx).requires_grad_(True) for v in (self.omega, self.mu))
        return StackedValues([self.cfgs[i] for i in keep], omega, mu, [self.metrics[i] for i in keep], self.marginal)

    @property
    def tensors(self) -> list:
        return [self.omega, self.mu]

    def run_tensors(self, r: int) -> list:
        return [self.omega[r], self.mu[r]]

    def hook_state(self, r: int) -> tuple:
        return self.omega[r].detach().clone(), self.mu[r].detach().clone()

    def readout(self, r: int, cache: dict):
        return self.omega[r].detach().cpu().double().tolist(), self.mu[r].detach().cpu().double().tolist(), 0.0

    def losses(self, batch, k: int) -> torch.Tensor:
        """Per-run batch losses (R,), runs in stream-major order, k per stream.  Whole prompts:
        y_hat_i = sum_h mu[h,i] sum_l p_hl y_{l,i}, p_h = softmax_l(sum_j omega[h,j] s_{l,j})
        with the block scores s (numerics.reduced.block_scores, once per stream) and the k
        runs' H heads of a stream read as k H heads; marginal: each run's
        numerics.exact_reduced.marginal_mean_loss on its stream's MarginalPrompts."""
        H, m = self.omega.shape[1:]
        if self.marginal:
            for pr in batch:
                if not isinstance(pr, MarginalPrompts):
                    raise TypeError("with estimator='marginal' a batch source must return "
                                    f"numerics.exact_reduced.MarginalPrompts, got {type(pr).__name__}")
            return torch.stack([marginal_mean_loss(self.omega[r], self.mu[r], batch[r // k], c.tasks, c.sigma)
                                for r, c in enumerate(self.cfgs)])
        scores, labels = block_scores(batch, self.cfgs[0])                   # (S, B, L, m) each
        S, B = scores.shape[:2]
        logits = torch.matmul(self.omega.reshape(S, 1, k * H, m), scores.transpose(-1, -2))   # (S, B, k H, L)
        c = torch.matmul(torch.softmax(logits, dim=-1), labels).view(S, B, k, H, m)
        pred = (self.mu.reshape(S, 1, k, H, m) * c).sum(dim=3)                 # (S, B, k, m)
        return ((pred - batch.target[:, :, None]) ** 2).sum(dim=-1).mean(dim=1).reshape(S * k)

    def step(self, grads, lr: torch.Tensor) -> None:
        om, mu = self.omega.detach(), self.mu.detach()
        factors = [f(om[r], mu[r]) for r, f in enumerate(self.metrics)]
        self.omega.sub_(lr.view(-1, 1, 1) * torch.stack([f[0] for f in factors]) * grads[0])
        self.mu.sub_(lr.view(-1, 1, 1) * torch.stack([f[1] for f in factors]) * grads[1])

    def leave(self, run: "Run", r: int) -> None:
        pass


@dataclass
class Run:
    """One run of a program: its configuration, its stream, its record steps and what it has
    produced so far."""
    index: int                     # position in the caller's arguments
    cfg: ProblemConfig
    tcfg: object                   # numerics.train.TrainConfig
    stream: int                    # index into the program's streams
    record_at: set
    on_record: Optional[Callable]
    start: object = None           # full: a model trained in place; reduced: (omega0, mu0) tensors
    metric: Optional[Callable] = None
    estimator: str = "prompts"
    read_records: bool = True      # False: (omega, mu, residual) read at the last step only (None before)
    losses: Optional[torch.Tensor] = None   # (steps + 1,) batch losses: a row of the program's table
    trajectory: list = field(default_factory=list)
    checked: int = 0               # losses[:checked] have passed the divergence rule
    final: Optional[MultiHeadAttention] = None
    error: Optional[BaseException] = None
    fingerprint: dict = field(default_factory=dict)
    wall_before: float = 0.0       # seconds of the run before a resumed checkpoint


@dataclass
class Stream:
    """A source of one batch per step shared by the runs that read it: fresh draws from its
    generator (``draw(generator, out)``), one fixed batch, or a run's own ``source(step)``."""
    draw: Callable
    seed: Optional[int] = None
    generator: Optional[torch.Generator] = None
    fixed: object = None
    source: Optional[Callable] = None

    def batch(self, step: int, out=None):
        if self.source is not None:
            return self.source(step)
        return self.fixed if self.fixed is not None else self.draw(self.generator, out)

    def first(self):
        """The stream's batch at step 0, drawn again (for the fingerprint of a resumed run)."""
        return self.fixed if self.fixed is not None else self.draw(make_generator(self.seed, self.generator.device))


class _Layout:
    """Which run sits where in the stack and which stream each batch slot holds: stream-major
    with k runs per slot when every stream has k runs (S = R / k slots), else one slot per run
    (a stream read by several such runs is drawn once and copied).  Whole prompts are held in
    one stacked buffer (S, B, ...) (one run's own batch is read where it is, of any size);
    other batches (MarginalPrompts) as a list of S."""

    def __init__(self, runs: list, active: Sequence[int], cfg: ProblemConfig, batch: int, stacked: bool):
        by_stream: dict = {}
        for a in active:
            by_stream.setdefault(runs[a].stream, []).append(a)
        counts = {len(v) for v in by_stream.values()}
        uniform = len(counts) == 1
        self.k = counts.pop() if uniform else 1
        self.order = sorted(active, key=lambda a: (runs[a].stream, a))
        self.slots = sorted(by_stream) if uniform else [runs[a].stream for a in self.order]
        self.cfg, self.size, self.stacked = cfg, batch, stacked
        self.buffer = self.current = None
        self.held = [None] * len(self.slots)     # what a slot last copied (a fixed batch is copied once)

    def slot(self, j: int):
        """Slot j's batch of the step filled last."""
        c = self.current
        return Prompts(c.context[j], c.query[j], c.target[j]) if self.stacked else c[j]

    def fill(self, streams: list, step: int):
        """Every slot's batch of this step: fresh streams drawn into the buffer (once per stream),
        fixed batches and batch sources copied -- a source's batch only when it is not the very
        tensors, unchanged, that the slot holds already (a fixed batch)."""
        drawn: dict = {}
        if not self.stacked:
            self.current = [drawn[s] if s in drawn else drawn.setdefault(s, streams[s].batch(step)) for s in self.slots]
            return self.current
        own = streams[self.slots[0]]
        if len(self.slots) == 1 and (own.fixed is not None or own.source is not None):
            pr = own.batch(step)
            self.current = Prompts(pr.context[None], pr.query[None], pr.target[None])
            return self.current
        if self.buffer is None:
            n, c, opts = len(self.slots), self.cfg, dict(dtype=self.cfg.torch_dtype, device=self.cfg.device)
            self.buffer = Prompts(context=torch.empty(n, self.size, c.L, c.token_dim, **opts),
                                  query=torch.empty(n, self.size, c.token_dim, **opts),
                                  target=torch.empty(n, self.size, c.m, **opts))
        self.current = self.buffer
        for j, s in enumerate(self.slots):
            st, view = streams[s], self.slot(j)
            fresh = st.fixed is None and st.source is None
            if fresh and s not in drawn:
                drawn[s] = st.batch(step, out=view)
                continue
            pr = drawn[s] if s in drawn else drawn.setdefault(s, st.batch(step))
            # a copy of this step's draw: always; a fixed batch or a source's: kept alive (its memory
            # cannot be reused) with its tensors' version counters (an in-place change is seen)
            held = None if fresh else (pr, tuple(t._version for t in (pr.context, pr.query, pr.target)))
            old = self.held[j]
            if held is None or old is None or old[0] is not pr or old[1] != held[1]:
                for name in ("context", "query", "target"):
                    getattr(view, name).copy_(getattr(pr, name))
                self.held[j] = held
        return self.buffer


class _Checkpoint:
    """The checkpoint of a program of one run (``tcfg.checkpoint``): the run's state every
    ``checkpoint_every`` steps, written through numerics.io.write_output (a temp file in the
    same directory and os.replace: never half a file; missing parent directories created), read
    back field by field by numerics.checkpoint.read (a file that is not this run's is refused)."""

    def __init__(self, run: Run, stack, stream: Stream):
        cfg, tcfg = run.cfg, run.tcfg
        self.path, self.every = tcfg.checkpoint, tcfg.checkpoint_every
        self.spec = checkpoint.Run(
            kind=stack.kind, estimator=run.estimator, stream=STREAM_VERSION, config=cfg.to_dict(),
            train=tcfg.to_dict(), params=stack.run_tensors(0), generator=stream.generator, steps=tcfg.steps,
            record_at=frozenset(run.record_at), lr=tcfg.lr, diverge_loss=tcfg.diverge_loss, heads=cfg.heads,
            m=cfg.m, dtype=cfg.torch_dtype)

    def resume(self, run: Run, stack, stream: Stream) -> int:
        """The step the run continues from: 0, or a checked checkpoint's, its state restored."""
        if not os.path.exists(self.path):
            return 0
        saved = checkpoint.read(self.path, self.spec)
        with torch.no_grad():
            for p, v in zip(stack.run_tensors(0), saved.params):
                p.copy_(v.to(p.device, p.dtype))
        stream.generator.set_state(saved.generator_state)
        run.losses[:saved.step] = saved.losses.to(run.losses.device, run.losses.dtype)
        run.trajectory = [Record(**r) for r in saved.trajectory]
        run.checked, run.wall_before = saved.step, saved.wall_seconds
        return saved.step

    def save(self, run: Run, stack, stream: Stream, step: int, wall: float) -> None:
        state = checkpoint.payload(self.spec, step, stack.run_tensors(0), stream.generator, run.losses,
                                   [asdict(r) for r in run.trajectory], wall)
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        buf = io.BytesIO()
        torch.save(state, buf)
        write_output(self.path, buf.getvalue())


def _first_divergence(r: Run, upto: int) -> Optional[TrainingDiverged]:
    """The error of the first of r's unchecked losses up to step ``upto`` that diverged."""
    for k, v in enumerate(r.losses[r.checked:upto + 1].cpu().tolist(), start=r.checked):
        if diverged(v, r.tcfg):
            return divergence(k, v, r.cfg, r.tcfg)
    r.checked = upto + 1
    return None


class Program:
    """Runs of one shape, batch size and kind (``stack_type``: StackedAttention or
    StackedValues) trained together by :meth:`run`, the one gradient-descent loop: step k's
    batches drawn, each run's loss recorded before its update, every run updated; a last batch
    at a run's last step gives its final record."""

    def __init__(self, runs: list, streams: list, stack_type, batch: int):
        use_precise_float32()
        self.runs, self.streams, self.batch, self.cfg0 = runs, streams, batch, runs[0].cfg
        self.stacked = runs[0].estimator != "marginal"
        self.n_max = max(r.tcfg.steps for r in runs)
        self.table = torch.zeros(len(runs), self.n_max + 1, dtype=self.cfg0.torch_dtype, device=self.cfg0.device)
        for a, r in enumerate(runs):
            r.losses = self.table[a, :r.tcfg.steps + 1]
        self.lay = _Layout(runs, range(len(runs)), self.cfg0, batch, self.stacked)
        self.stack = stack_type.from_runs([runs[a] for a in self.lay.order])
        for j, a in enumerate(self.lay.order):
            runs[a].fingerprint["weights"] = fingerprint(*self.stack.run_tensors(j))
        self.pack(self.lay.order)
        # a sync per step costs nothing on the CPU; on a GPU the losses are checked every 50 steps
        self.check_every = 1 if self.cfg0.torch_device.type == "cpu" else 50
        self.ckpt = _Checkpoint(runs[0], self.stack, streams[0]) if len(runs) == 1 and runs[0].tcfg.checkpoint else None
        self.first = self.ckpt.resume(runs[0], self.stack, streams[0]) if self.ckpt is not None else 0
        if self.first:
            runs[0].fingerprint["prompts"] = fingerprint(streams[0].first())

    def pack(self, order: list) -> None:
        """The stack's runs (positions in ``runs``, stack order), as an index, and their steps."""
        self.active = list(order)
        self.rows = torch.as_tensor(self.active, dtype=torch.long, device=self.cfg0.device)
        self.lr = torch.tensor([self.runs[a].tcfg.lr for a in order], dtype=self.cfg0.torch_dtype,
                               device=self.cfg0.device)

    def run(self) -> tuple[float, float]:
        """Train every run to its end (or its error); (wall, CPU) seconds of the loop."""
        t0, cpu0 = time.perf_counter(), time.process_time()
        kind, runs = self.stack.kind, self.runs
        bar = tqdm(total=self.n_max, initial=self.first, disable=not any(r.tcfg.progress for r in runs),
                   desc=f"{kind} GD" + (f", {len(runs)} runs" if len(runs) > 1 else ""), unit="step")
        try:
            for step in range(self.first, self.n_max + 1):
                if self.ckpt is not None and step > self.first and step % self.ckpt.every == 0:
                    self.ckpt.save(runs[0], self.stack, self.streams[0], step,
                                   runs[0].wall_before + time.perf_counter() - t0)
                batch = self.lay.fill(self.streams, step)
                if step == self.first:
                    self.fingerprint_prompts()
                per_run = self.stack.losses(batch, self.lay.k)
                vals = per_run.detach()
                self.table[self.rows, step] = vals
                leaving = self.account(step, vals)
                if len(leaving) == len(self.active):
                    break
                grads = torch.autograd.grad(per_run.sum(), self.stack.tensors)
                with torch.no_grad():
                    self.stack.step(grads, self.lr)
                if leaving:
                    self.repack(leaving)
                bar.update(1)
        finally:
            bar.close()
        return time.perf_counter() - t0, time.process_time() - cpu0

    def fingerprint_prompts(self) -> None:
        """Each run's first batch, by numerics.seeds.digest (once per stream)."""
        seen: dict = {}
        for j, a in enumerate(self.active):
            r = self.runs[a]
            if r.stream not in seen:
                seen[r.stream] = fingerprint(self.lay.slot(j // self.lay.k))
            r.fingerprint.setdefault("prompts", seen[r.stream])

    def account(self, step: int, vals: torch.Tensor) -> set:
        """This step's divergence checks, records and hooks; the stack positions of the runs
        that leave now (their last step, a diverged loss, a raising hook or readout)."""
        host = vals.tolist() if self.check_every == 1 else None
        saves_next = self.ckpt is not None and (step + 1) % self.ckpt.every == 0
        leaving, cache = set(), {}
        for j, a in enumerate(self.active):
            r = self.runs[a]
            ends, records = step == r.tcfg.steps, step in r.record_at
            if host is not None:
                r.error = divergence(step, host[j], r.cfg, r.tcfg) if diverged(host[j], r.tcfg) else None
            elif step % self.check_every == 0 or ends or records or saves_next:
                r.error = _first_divergence(r, step)
            if r.error is None and records:
                loss, t = host[j] if host is not None else float(vals[j]), step * r.tcfg.lr
                try:
                    omega, mu, residual = (self.stack.readout(j, cache) if r.read_records or ends
                                           else (None, None, None))
                    r.trajectory.append(Record(t=t, loss=loss, omega=omega, mu=mu, residual=residual))
                    if r.on_record is not None:
                        r.on_record(step, t, self.stack.hook_state(j), loss)
                except Exception as exc:        # ends this run only
                    r.error = exc
            if r.error is not None or ends:
                leaving.add(j)
                self.stack.leave(r, j)
        return leaving

    def repack(self, leaving: set) -> None:
        keep = [a for j, a in enumerate(self.active) if j not in leaving]
        pos = {a: j for j, a in enumerate(self.active)}
        self.lay = _Layout(self.runs, keep, self.cfg0, self.batch, self.stacked)
        self.stack = self.stack.select([pos[a] for a in self.lay.order])
        self.pack(self.lay.order)
