"""Scratch benchmark of the prompt sampler (issues 15 and 28): the current keyed stream
(numerics.data, STREAM_VERSION; drawing into fresh tensors and into the previous call's,
``out=``, as the trainer does) against the version-1 sampler (one sequential torch draw), the
trainer's step with each, and the hand-written backward of numerics.fused against autograd.

    python -m scripts.bench_sampling                 # everything (a few minutes on 2 cores)
    python -m scripts.bench_sampling --only sampling --repeats 9

(run with -m from the repository root, so that this checkout's numerics is imported)

Times are medians over interleaved repeats of wall-clock and process CPU milliseconds (CPU
time counts every thread of the process, so with 2 threads it is the total work, and on a
machine shared with other jobs wall time also counts waiting for a core: the load average
is printed).  Peak memory of one forward+backward is measured in a fresh subprocess as the
growth of the peak resident set over the resident set holding the batch and the model.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import numerics.train as trainer
from numerics.config import ProblemConfig
from numerics.data import STREAM_VERSION, make_generator, sample_prompts
from numerics.fused import attention_readout
from numerics.model import MultiHeadAttention, mse_loss
from numerics.io.files import check_output_path, write_output
from numerics.io.options import int_option

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAPER_SMALL = dict(tasks=(4, 4, 4), heads=3, L=256)
BATCH = 4096


def sample_prompts_v1(cfg: ProblemConfig, batch: int, generator: torch.Generator, symmetrize=False, out=None):
    """The version-1 sampler (numerics/data.py before stream version 2), for comparison only:
    one sequential float32 draw of (x, eps), then q, g, from the caller's generator (``out``,
    which the trainer passes, is ignored: version 1 allocated every batch)."""
    from numerics.data import Prompts
    assert not symmetrize
    d, m, L, D, dt = cfg.d, cfg.m, cfg.L, cfg.token_dim, cfg.torch_dtype

    def normal(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float32, device=cfg.device).to(dt)

    context = normal(batch, L, D)
    x, eps = context[..., :d], context[..., d:]
    query = torch.zeros(batch, D, dtype=dt, device=cfg.device)
    query[:, :d] = normal(batch, d)
    q = query[:, :d]
    g = normal(batch, d)
    coef = g[:, :, None] * cfg.task_indicator()[None]
    if cfg.basis != "identity":
        coef = cfg.basis_matrix() @ coef
    y = torch.bmm(x, coef)
    if cfg.sigma > 0:
        y = y + cfg.sigma * eps
    context[..., d:] = y
    target = torch.bmm(q[:, None, :], coef)[:, 0, :]
    return Prompts(context=context, query=query, target=target)


def timed(fn):
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return (time.perf_counter() - t0) * 1e3, (time.process_time() - c0) * 1e3


def interleaved(fns: dict, repeats: int) -> dict:
    """Median (wall ms, cpu ms) of each callable, the callables run in turn each repeat."""
    for fn in fns.values():
        fn()                                                    # warm up
    samples = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            samples[k].append(timed(fn))
    return {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v))
            for k, v in samples.items()}


def bench_sampling(repeats: int) -> list[dict]:
    rows = []
    for dtype, sigma, threads in itertools.product(("float32", "float64"), (0.0, 0.5), (1, 2)):
        cfg = ProblemConfig(**PAPER_SMALL, dtype=dtype, sigma=sigma)
        torch.set_num_threads(threads)
        g_old, g_new, g_out = make_generator(0, "cpu"), make_generator(0, "cpu"), make_generator(0, "cpu")
        buf = sample_prompts(cfg, BATCH, make_generator(1, "cpu"))
        res = interleaved({"v1": lambda: sample_prompts_v1(cfg, BATCH, g_old),
                           "current": lambda: sample_prompts(cfg, BATCH, g_new, threads=threads),
                           "current_out": lambda: sample_prompts(cfg, BATCH, g_out, threads=threads, out=buf)},
                          repeats)
        rows.append(dict(dtype=dtype, sigma=sigma, threads=threads,
                         v1_wall_ms=res["v1"][0], v1_cpu_ms=res["v1"][1],
                         current_wall_ms=res["current"][0], current_cpu_ms=res["current"][1],
                         out_wall_ms=res["current_out"][0], out_cpu_ms=res["current_out"][1]))
    return rows


def trainer_step_ms(cfg: ProblemConfig, sampler, steps: int) -> tuple[float, float]:
    """Median (wall ms, cpu ms) per step of numerics.train.train, timed between the
    trainer's consecutive sampler calls (steps with a trajectory record left out)."""
    stamps = []

    def stamped(*args, **kwargs):
        stamps.append((time.perf_counter(), time.process_time()))
        return sampler(*args, **kwargs)

    original = trainer.sample_prompts
    trainer.sample_prompts = stamped
    try:
        trainer.train(cfg, trainer.TrainConfig(lr=0.05, time=0.05 * steps, batch=BATCH, records=2,
                                               progress=False))
    finally:
        trainer.sample_prompts = original
    inner = list(zip(stamps[1:-1], stamps[2:]))            # step 0 and the last hold records
    return (statistics.median((b[0] - a[0]) * 1e3 for a, b in inner),
            statistics.median((b[1] - a[1]) * 1e3 for a, b in inner))


def _fused_forward(self, context, query):
    """MultiHeadAttention.forward through numerics.fused (patched in for the bench only)."""
    W, U = self.merged_weights()
    return attention_readout(W, U, context, query)


def bench_trainer(steps: int) -> list[dict]:
    """The default (factored) model: v1 sampler, the current sampler, current + fused backward."""
    rows = []
    for dtype, threads in itertools.product(("float32", "float64"), (1, 2)):
        cfg = ProblemConfig(**PAPER_SMALL, dtype=dtype)
        torch.set_num_threads(threads)
        old = trainer_step_ms(cfg, sample_prompts_v1, steps)
        new = trainer_step_ms(cfg, sample_prompts, steps)
        autograd_forward = MultiHeadAttention.forward
        MultiHeadAttention.forward = _fused_forward
        try:
            fused = trainer_step_ms(cfg, sample_prompts, steps)
        finally:
            MultiHeadAttention.forward = autograd_forward
        rows.append(dict(dtype=dtype, threads=threads, v1_wall_ms=old[0], v1_cpu_ms=old[1],
                         current_wall_ms=new[0], current_cpu_ms=new[1], fused_wall_ms=fused[0],
                         fused_cpu_ms=fused[1]))
    return rows


def _step_fn(cfg: ProblemConfig, which: str):
    model = MultiHeadAttention(cfg)
    pr = sample_prompts(cfg, BATCH, make_generator(0, "cpu"))
    params = list(model.parameters())

    def step():
        if which == "autograd":
            pred = model(pr.context, pr.query)
        else:
            W, U = model.merged_weights()
            pred = attention_readout(W, U, pr.context, pr.query)
        return torch.autograd.grad(mse_loss(pred, pr.target), params)
    return step


def _status_kib(field: str) -> int:
    """VmRSS (resident now) or VmHWM (peak resident) of this process, KiB.  VmHWM belongs to
    this process's own address space; ru_maxrss would not do (Linux carries the parent's
    peak into a child across fork + exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_probe(dtype: str, param: str, which: str) -> None:
    """(Run in a subprocess.)  Print the growth in MiB of the peak RSS over the RSS that holds
    the batch and the model, during one forward+backward.  The batch is made directly in
    cfg.dtype so that building it leaves no higher peak than holding it."""
    torch.set_num_threads(1)
    cfg = ProblemConfig(**PAPER_SMALL, dtype=dtype, param=param, init="random_full", init_scale=1.0)
    model = MultiHeadAttention(cfg)
    gen = torch.Generator().manual_seed(0)
    context = torch.randn(BATCH, cfg.L, cfg.token_dim, generator=gen, dtype=cfg.torch_dtype)
    query = torch.zeros(BATCH, cfg.token_dim, dtype=cfg.torch_dtype)
    query[:, :cfg.d] = torch.randn(BATCH, cfg.d, generator=gen, dtype=cfg.torch_dtype)
    target = torch.randn(BATCH, cfg.m, generator=gen, dtype=cfg.torch_dtype)
    params = list(model.parameters())
    base = _status_kib("VmRSS")
    prior_peak = _status_kib("VmHWM")
    if which == "autograd":
        pred = model(context, query)
    else:
        W, U = model.merged_weights()
        pred = attention_readout(W, U, context, query)
    torch.autograd.grad(mse_loss(pred, target), params)
    peak = _status_kib("VmHWM")
    # valid only if the step set a new high (else the set-up's peak hides the step's)
    print(json.dumps({"peak_growth_mib": (peak - base) / 1024 if peak > prior_peak else None,
                      "prior_peak_excess_mib": (prior_peak - base) / 1024,
                      "context_mib": context.numel() * context.element_size() / 2 ** 20}))


def bench_fused(repeats: int) -> list[dict]:
    rows = []
    for dtype, param in itertools.product(("float32", "float64"), ("merged", "factored")):
        cfg = ProblemConfig(**PAPER_SMALL, dtype=dtype, param=param, init="random_full", init_scale=1.0)
        row = dict(dtype=dtype, param=param)
        for threads in (1, 2):
            torch.set_num_threads(threads)
            res = interleaved({w: _step_fn(cfg, w) for w in ("autograd", "fused")}, repeats)
            for w in ("autograd", "fused"):
                row[f"{w}_wall_ms_t{threads}"], row[f"{w}_cpu_ms_t{threads}"] = res[w]
        for w in ("autograd", "fused"):
            row[f"{w}_peak_mib"] = float("nan")
            for _ in range(3):                          # a probe whose set-up peak hid the step is rerun
                out = subprocess.run([sys.executable, "-m", "scripts.bench_sampling", "--memory-probe", dtype,
                                      param, w], capture_output=True, text=True, check=True, cwd=ROOT).stdout
                probe = json.loads(out.strip().splitlines()[-1])
                row["context_mib"] = probe["context_mib"]
                if probe["peak_growth_mib"] is not None:
                    row[f"{w}_peak_mib"] = probe["peak_growth_mib"]
                    break
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    cells = [[f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = lambda vals: "  ".join(v.rjust(w) for v, w in zip(vals, widths))  # noqa: E731
    return "\n".join([line(keys)] + [line(c) for c in cells])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=("sampling", "trainer", "fused"), action="append")
    p.add_argument("--repeats", type=int_option("--repeats", 1, 1000), default=7)
    p.add_argument("--steps", type=int_option("--steps", 1, 10000), default=8, help="trainer steps per run")
    p.add_argument("--json", default=None, help="also write the rows as JSON here (checked before the timing)")
    p.add_argument("--memory-probe", nargs=3, metavar=("DTYPE", "PARAM", "WHICH"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.memory_probe:
        memory_probe(*args.memory_probe)
        return 0
    if args.json:
        try:
            check_output_path(args.json, "--json")
        except ValueError as exc:
            p.error(str(exc))
    parts = args.only or ["sampling", "trainer", "fused"]
    print(f"blocks {PAPER_SMALL['tasks']}, H = {PAPER_SMALL['heads']}, L = {PAPER_SMALL['L']}, batch {BATCH}; "
          f"stream version {STREAM_VERSION}; torch {torch.__version__}; {os.cpu_count()} cpus; "
          f"load average {os.getloadavg()[0]:.2f}")
    out = {}
    for part, fn in (("sampling", lambda: bench_sampling(args.repeats)),
                     ("trainer", lambda: bench_trainer(args.steps)),
                     ("fused", lambda: bench_fused(args.repeats))):
        if part in parts:
            out[part] = fn()
            print(f"\n[{part}] (ms; load average now {os.getloadavg()[0]:.2f})")
            print(table(out[part]), flush=True)
    if args.json:
        write_output(args.json, json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
