"""Prompts of the decomposable multi-task linear regression (SPEC.md, Setting).

One prompt: x_1 .. x_L, q i.i.d. N(0, I_d); task parameters g_i ~ N(0, I_{r_i}) fresh per
prompt, independent across tasks; labels y_{l,i} = g_i^T Phi_i^T x_l + eps_{l,i},
eps ~ N(0, sigma^2); target y_{q,i} = g_i^T Phi_i^T q (noiseless).  Tokens z_l = (x_l, y_l),
query token z_q = (q, 0).

Written as one matrix per prompt: y_l = B^T x_l + eps_l with B = Phi diag(g) E (d x m),
E the task indicator (E[k, i] = 1 iff basis coordinate k belongs to task i).

The stream (version ``STREAM_VERSION`` = 2; version 1 drew the whole batch from the caller's
generator in one thread).  The caller's ``torch.Generator`` fixes the stream:

- CPU: each call draws one 63-bit key from the caller's generator (so its state advances by
  the same amount whatever the batch, sigma or thread count, and a saved generator state
  resumes the stream bit-identically).  The prompts are split into fixed chunks of
  ``CHUNK_PROMPTS``; chunk c draws (x, q, g) from a generator derived from (key, c, 0) and
  the noise eps from one derived from (key, c, 1) (counter-based: a chunk's numbers depend
  only on the key and its index, never on which thread draws it, so 1 or N threads give the
  same batch).  The chunks are drawn on a thread pool of ``threads`` workers (default
  ``torch.get_num_threads()``): torch's seeded CPU sampler runs on one thread per generator
  but releases the GIL.  Each chunk's labels are built on the caller's thread as soon as the
  pool has drawn it.  The derived generators are torch Mersenne Twisters whose whole
  624-word state is filled from SplitMix64 of the derived 64-bit seed (torch's manual_seed
  keeps only 32 bits of a seed: by the birthday bound, per-(call, chunk) seeds would
  repeat a chunk's numbers once some 2^16 chunks had been drawn).
  Because eps has its own sub-stream, x, q, g do not depend on whether eps was drawn: it is
  skipped when sigma = 0 and runs that differ only in sigma still share x, q, g (common
  random numbers).  A batch's whole chunks do not depend on the batch size either (the
  first 256 prompts of a batch of 4096 are those of a batch of 256).
- CUDA: one stream from the caller's device generator, no threads (the GPU draws in
  parallel), in the fixed order x, q, g, eps; eps is drawn even when sigma = 0 (it costs a
  GPU microseconds, and skipping it would shift the generator and so the next call's x, q, g
  between runs that differ only in sigma).

CPU and CUDA give different streams for the same seed.  The Gaussians are drawn in float32
and cast to cfg.dtype (see ``_normal``), so float32 and float64 runs see the same data.

``symmetrize=True`` applies the per-task sign-flip group {+-1}^m (y_i, g_i, eps_i -> -)
to each drawn prompt and returns all 2^m images, so that sign-flip identities (the reason
the cross blocks of the gradient vanish) hold exactly on the finite batch.
"""
from __future__ import annotations

import itertools
import numbers
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from .config import ProblemConfig, check_device

STREAM_VERSION = 2
"""Version of the prompt stream (1: one sequential draw per call; 2: keyed chunks, see the
module docstring).  A checkpoint written under another version cannot resume this stream."""

CHUNK_PROMPTS = 256
"""Prompts per chunk of the CPU stream.  Part of the stream's definition: changing it changes
every batch (bump STREAM_VERSION).  256 prompts keep the per-chunk overhead (a generator
state and a few torch calls, ~0.1 ms) small against the draws at L >= 64 while leaving
16 chunks to balance over the threads at batch 4096."""

_MASK64 = (1 << 64) - 1
_MT_WORDS = 624                       # mt19937 state words
_MT_STATE_OFFSET = 24                 # bytes before the state words in torch's CPU generator state


@dataclass
class Prompts:
    context: torch.Tensor   # (B, L, d+m): tokens z_l = (x_l, y_l)
    query: torch.Tensor     # (B, d+m):    z_q = (q, 0)
    target: torch.Tensor    # (B, m):      y_q (noiseless)

    @property
    def batch(self) -> int:
        return self.context.shape[0]


def make_generator(seed: int, device) -> torch.Generator:
    """A torch.Generator on ``device`` seeded with ``seed`` (prompts are drawn on-device)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    gen = torch.Generator(device=check_device(device))
    gen.manual_seed(int(seed))
    return gen


def sign_flips(m: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """All 2^m sign vectors of the per-task sign-flip group, (2^m, m); row 0 is the identity."""
    return torch.tensor(list(itertools.product((1.0, -1.0), repeat=m)), dtype=dtype, device=device)


# --- counter-based generators ----------------------------------------------------------------

def _mix64(z: int) -> int:
    """SplitMix64's finaliser: a bijection of 64-bit integers that scrambles every bit."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _splitmix64_words(seed: int, n: int) -> np.ndarray:
    """The first n outputs of SplitMix64 started at ``seed`` (uint64; numpy wraps mod 2^64)."""
    golden = np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = np.uint64(seed & _MASK64) + golden * np.arange(1, n + 1, dtype=np.uint64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def chunk_seed(key: int, chunk: int, substream: int) -> int:
    """The 64-bit seed of chunk ``chunk``'s sub-stream ``substream`` (0: x, q, g; 1: eps)
    for the call with ``key``: nested SplitMix64 finalisers, distinct inputs give
    unrelated seeds."""
    return _mix64(_mix64(_mix64(key) ^ (2 * chunk + substream + 1)) + 0x9E3779B97F4A7C15)


_template_lock = threading.Lock()
_template_state: torch.Tensor | None = None


def _mt_generator(words: np.ndarray) -> torch.Generator:
    """A CPU torch.Generator whose mt19937 state is ``words`` (624 uint32 values, not all 0),
    positioned to regenerate (as right after seeding).  torch's CPU state layout (uint64 seed,
    int32 left, int32 seeded, uint64 next, 624 uint64 words, normal caches) is checked once
    against manual_seed (see _check_state_layout)."""
    global _template_state
    if _template_state is None:
        with _template_lock:
            if _template_state is None:
                _template_state = _check_state_layout()
    state = _template_state.clone()
    view = state.numpy()
    view[_MT_STATE_OFFSET:_MT_STATE_OFFSET + 8 * _MT_WORDS] = (
        words.astype("<u8").view(np.uint8))
    gen = torch.Generator()
    gen.set_state(state)
    return gen


def _mt19937_init_words(seed: int) -> np.ndarray:
    """mt19937's standard initialisation from a 32-bit seed (init_genrand)."""
    words = [seed & 0xFFFFFFFF]
    for i in range(1, _MT_WORDS):
        prev = words[-1]
        words.append((1812433253 * (prev ^ (prev >> 30)) + i) & 0xFFFFFFFF)
    return np.array(words, dtype=np.uint64)


def _check_state_layout() -> torch.Tensor:
    """torch's CPU generator state right after manual_seed(5489), after checking that writing
    mt19937 words at _MT_STATE_OFFSET reproduces manual_seed (else torch changed its layout)."""
    ref = torch.Generator().manual_seed(5489)
    template = ref.get_state()
    raw = template.numpy()
    words = raw[_MT_STATE_OFFSET:_MT_STATE_OFFSET + 8 * _MT_WORDS].view("<u8")
    probe = template.clone()
    probe.numpy()[_MT_STATE_OFFSET:_MT_STATE_OFFSET + 8 * _MT_WORDS] = (
        _mt19937_init_words(77).astype("<u8").view(np.uint8))
    gen = torch.Generator()
    gen.set_state(probe)
    if (raw.size != _MT_STATE_OFFSET + 8 * _MT_WORDS + 40
            or not np.array_equal(words, _mt19937_init_words(5489))
            or not torch.equal(torch.randn(64, generator=gen),
                               torch.randn(64, generator=torch.Generator().manual_seed(77)))):
        raise RuntimeError(f"this torch ({torch.__version__}) stores its CPU generator state in a layout "
                           "numerics.data does not know, so the keyed prompt stream cannot be built; "
                           "update _mt_generator for this torch version")
    return template


def _chunk_generator(key: int, chunk: int, substream: int) -> torch.Generator:
    seed = chunk_seed(key, chunk, substream)
    words = _splitmix64_words(seed, _MT_WORDS // 2).view(np.uint32).astype(np.uint64)
    return _mt_generator(words)


_pool_lock = threading.Lock()
_pools: dict[int, ThreadPoolExecutor] = {}


def _thread_pool(threads: int) -> ThreadPoolExecutor:
    """The process's pool of ``threads`` sampler threads (one pool per size, kept for reuse:
    idle threads cost nothing, and a pool is never shut down under a concurrent caller)."""
    with _pool_lock:
        if threads not in _pools:
            _pools[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sample_prompts")
        return _pools[threads]


# --- the sampler -------------------------------------------------------------------------------

def _normal(shape, generator: torch.Generator, device) -> torch.Tensor:
    # Gaussians are drawn in float32 (torch's vectorised CPU sampler, ~4x faster than its
    # float64 one) and cast to cfg.dtype by _assemble.  The draws are N(0, 1) rounded to
    # 24 bits (relative 6e-8), and the sampler's float32 Box-Muller uniforms (resolution
    # 2^-24) cap |z| at sqrt(2 ln 2^24) = 5.77, dropping a tail of mass 8e-9: both far below
    # any Monte-Carlo error of this project (a batch of 2048 prompts has relative errors ~1e-2).
    return torch.randn(shape, generator=generator, dtype=torch.float32, device=device)


def _assemble(x, q, g, eps, cfg: ProblemConfig, E: torch.Tensor, Phi: torch.Tensor | None,
              context: torch.Tensor, query: torch.Tensor, target: torch.Tensor) -> None:
    """Write into context (k, L, d+m), query (k, d+m), target (k, m) (cfg.dtype) the prompts
    of the float32 draws x (k, L, d), q (k, d), g (k, d), eps (k, L, m) or None:
    y_l = B^T x_l + sigma eps_l, y_q = B^T q with B = Phi diag(g) E (Phi None: identity)."""
    d, dt = cfg.d, cfg.torch_dtype
    context[..., :d] = x                                    # the cast happens in this copy
    coef = g.to(dt)[:, :, None] * E[None]                   # diag(g) E: (k, d, m)
    if Phi is not None:
        coef = Phi @ coef                                   # B = Phi diag(g) E
    y = torch.bmm(x if x.dtype == dt else context[..., :d], coef)
    if eps is not None and cfg.sigma > 0:
        y.add_(eps.to(dt), alpha=cfg.sigma)
    context[..., d:] = y
    query[:, :d] = q
    query[:, d:] = 0
    target.copy_(torch.bmm(query[:, None, :d], coef)[:, 0, :])


def _empty_prompts(cfg: ProblemConfig, n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dt = cfg.torch_dtype
    return (torch.empty(n, cfg.L, cfg.token_dim, dtype=dt, device=device),
            torch.empty(n, cfg.token_dim, dtype=dt, device=device),
            torch.empty(n, cfg.m, dtype=dt, device=device))


def _prompts_from_draws(cfg: ProblemConfig, x, q, g, eps) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(context, query, target) in cfg.dtype from float32 draws of the whole batch, in one
    pass (the device stream)."""
    dev = x.device
    context, query, target = _empty_prompts(cfg, x.shape[0], dev)
    Phi = cfg.basis_matrix().to(dev) if cfg.basis != "identity" else None
    _assemble(x, q, g, eps, cfg, cfg.task_indicator().to(dev), Phi, context, query, target)
    return context, query, target


class _serial_torch:
    """Within the block, torch ops on this thread run on one intra-op thread (restored on
    exit).  The labels are built in many small chunk-sized ops: with several intra-op
    threads each op would be a parallel region whose barrier waits for a descheduled thread
    whenever the cores are shared (measured: 600 ms instead of 150 ms per batch of 4096 on a
    loaded 2-core machine), while the sampler's own threads already keep the cores busy."""

    def __enter__(self):
        self.threads = torch.get_num_threads()
        if self.threads != 1:
            torch.set_num_threads(1)

    def __exit__(self, *exc):
        if self.threads != 1:
            torch.set_num_threads(self.threads)
        return False


def _sample_keyed_chunks(cfg: ProblemConfig, n: int, generator: torch.Generator, threads: int):
    """The CPU stream: one key from ``generator``; chunk c's float32 draws (from its own
    generators) on a pool of ``threads`` threads, each chunk's labels built on the caller's
    thread as soon as the chunk is drawn, while the pool draws the next ones.  The pool only
    draws (one serial torch kernel per tensor, GIL released); the building runs serially
    (see _serial_torch) in chunk-sized pieces whose operands stay in cache (2-3x less CPU
    time than one pass over the batch at L = 256)."""
    key = int(torch.randint(0, 2 ** 63 - 1, (), generator=generator, dtype=torch.int64))
    d, m, L = cfg.d, cfg.m, cfg.L
    context, query, target = _empty_prompts(cfg, n, "cpu")
    E = cfg.task_indicator()
    Phi = cfg.basis_matrix() if cfg.basis != "identity" else None
    noisy = cfg.sigma > 0

    def draw(c: int):
        k = min(n, (c + 1) * CHUNK_PROMPTS) - c * CHUNK_PROMPTS
        main = _chunk_generator(key, c, 0)
        x = _normal((k, L, d), main, "cpu")
        q = _normal((k, d), main, "cpu")
        g = _normal((k, d), main, "cpu")
        eps = _normal((k, L, m), _chunk_generator(key, c, 1), "cpu") if noisy else None
        return x, q, g, eps

    n_chunks = -(-n // CHUNK_PROMPTS)
    chunks = (map(draw, range(n_chunks)) if threads == 1 or n_chunks == 1
              else _thread_pool(threads).map(draw, range(n_chunks)))   # in order; re-raises
    with _serial_torch():
        for c, (x, q, g, eps) in enumerate(chunks):
            k = slice(c * CHUNK_PROMPTS, min(n, (c + 1) * CHUNK_PROMPTS))
            _assemble(x, q, g, eps, cfg, E, Phi, context[k], query[k], target[k])
    return context, query, target


def _draw_on_device(cfg: ProblemConfig, n: int, generator: torch.Generator):
    """The device (CUDA) stream's float32 draws: x, q, g, eps from ``generator`` in this
    order, eps always (so the generator advances by the same amount whatever sigma)."""
    d, m, L, dev = cfg.d, cfg.m, cfg.L, generator.device
    x = _normal((n, L, d), generator, dev)
    q = _normal((n, d), generator, dev)
    g = _normal((n, d), generator, dev)
    eps = _normal((n, L, m), generator, dev)
    return x, q, g, eps


def sample_prompts(cfg: ProblemConfig, batch: int, generator: torch.Generator,
                   symmetrize: bool = False, *, threads: int | None = None) -> Prompts:
    """Draw ``batch`` prompts of cfg's problem on cfg.device with ``generator`` (stream
    version STREAM_VERSION, see the module docstring; one call advances ``generator`` by a
    fixed amount).

    With ``symmetrize``, batch/2^m prompts are drawn and each is returned under all 2^m
    per-task sign flips (image k of prompt p at index k * batch/2^m + p).  ``threads``: CPU
    threads drawing the chunks (default torch.get_num_threads(); the numbers do not depend
    on it)."""
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    batch = int(batch)
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator (make it with make_generator(seed, "
                        f"cfg.device)), got {type(generator).__name__}")
    if generator.device.type != cfg.torch_device.type:
        raise ValueError(f"the generator is on {generator.device} but cfg.device is {cfg.device}; "
                         "make it with make_generator(seed, cfg.device)")
    if threads is None:
        threads = torch.get_num_threads()
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    n_flips = 2 ** cfg.m
    if symmetrize and batch % n_flips:
        raise ValueError(f"symmetrize=True returns every prompt under all 2^m = {n_flips} sign flips, so "
                         f"batch must be a multiple of {n_flips}; got {batch} (use e.g. "
                         f"{max(n_flips, batch - batch % n_flips)})")
    n = batch // n_flips if symmetrize else batch
    if generator.device.type == "cpu":
        context, query, target = _sample_keyed_chunks(cfg, n, generator, int(threads))
    else:
        context, query, target = _prompts_from_draws(cfg, *_draw_on_device(cfg, n, generator))
    if symmetrize:
        # flipping task i's sign maps (g_i, eps_i) -> -(g_i, eps_i): y_i, y_{q,i} -> -y_i, -y_{q,i}
        d, m = cfg.d, cfg.m
        s = sign_flips(m, cfg.torch_dtype, cfg.device)      # (2^m, m)
        context = context.repeat(n_flips, 1, 1)
        context[..., d:] *= s.repeat_interleave(n, dim=0)[:, None, :]
        query = query.repeat(n_flips, 1)
        target = (s[:, None, :] * target[None]).reshape(batch, m)
    return Prompts(context=context, query=query, target=target)
