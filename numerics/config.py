"""The problem: its configuration and its prompts.

The problem configuration: tasks, heads, context length, noise, basis, parametrisation,
initialisation, dtype and device, validated on construction.

Notation of docs/model.md: m tasks, task i owns an input block of size r_i, d = sum r_i, tokens
z = (x, y) in R^{d+m}.  Phi = [Phi_1 .. Phi_m] is an orthonormal basis of R^d whose column
groups split the blocks (identity: contiguous blocks; random: a seeded Haar-random
orthogonal matrix, to check basis invariance).

Parametrisations (H heads, one layer):
- ``factored``: W_h = K_h^T Q_h / s, U_h = O_h V_h with K, Q, V in R^{(d+m)x(d+m)},
  O in R^{m x (d+m)}; s = ``logit_scale`` (default 1: the authors' script has no scale).
- ``merged``: W_h in R^{(d+m)x(d+m)}, U_h in R^{m x (d+m)} trained directly.

Initialisations (scale s0 = ``init_scale``):
- ``decomposable`` (default, balanced, as in the authors' script): omega = s0 on every head
  and task; mu = s0 except 2 s0 on each head's favoured task h mod m.
- ``random_decomposable``: a point of D with omega, mu drawn i.i.d. uniform in
  [s0/2, 3 s0/2] (seed ``init_seed``): no head favoured by design.
- ``given``: omega = ``init_omega``, mu = ``init_mu`` (H x m nested tuples).
- ``random_full``: every trainable entry i.i.d. Gaussian (seed ``init_seed``), scaled so
  that W_h and U_h have entries of standard deviation about s0 / sqrt(d+m): a generic,
  non-decomposable start.
- ``uniform_full``: every trainable entry i.i.d. uniform on [-s0/sqrt(d+m), s0/sqrt(d+m)]
  (seed ``init_seed``).  With s0 = 1 and logit_scale = sqrt(d+m) this is PyTorch's
  nn.Linear default (kaiming_uniform with a = sqrt(5): bound 1/sqrt(fan_in)) with the
  authors' logit scaling 1/sqrt(d+m) (no biases: the model has none) for K, Q and V; for O
  its bound is sqrt(H) times the authors' (their o_proj reads the H heads' concatenated
  outputs, fan_in H (d+m)): ``linear_default`` is their module's default exactly.
- ``linear_default`` (factored only): the authors' module as nn.Linear initialises it, times
  s0: K, Q, V entries i.i.d. uniform on [-s0/sqrt(D), s0/sqrt(D)] (q_proj, k_proj, v_proj:
  fan_in D = d+m), O entries on [-s0/sqrt(H D), s0/sqrt(H D)] (o_proj: fan_in H D), seed
  ``init_seed``.  s0 = 1 with logit_scale sqrt(D) is the authors' released script.
- ``authors_small`` (factored only): the authors' small initialisation (their
  ``initialization()``, defined but not called by the released script), with c =
  s0 L^(-3/4): per head one a_h ~ N(0, 1) (seed ``init_seed``) multiplying both K_h = Q_h =
  a_h c I_D (the whole token, y coordinates included, as theirs); V_h = diag(0_d, v_h),
  O_h = [0 | diag(v_h)] with v_h[j] = c, and 2c on the head's favoured task j = h mod m (theirs
  is head i for task i and exists only for H = m: it indexes task h).  So omega[h, i] =
  a_h^2 c^2 / s on every task, mu[h, j] = c^2 and 4 c^2 on the favoured task, balanced
  (K = Q, O = V^T on Y), on D up to W's y columns (a_h^2 c^2 / s on W_YY: gradient-free,
  no query reads them).  s0 = 1 is theirs (v in [L^(-3/4), 2 L^(-3/4)]).
- ``unbalanced_decomposable``: a point of D with the default values of ``decomposable``
  except for signs, realised with unbalanced factors (factored only), as in the authors'
  last version: per head a_h, b_h ~ N(0, 1) (seed ``init_seed``); Q_XX block i =
  sqrt(s |omega_i| / |a_h|) Phi_i Phi_i^T, K_h = a_h Q_h (so omega[h, i] = sign(a_h) s0 and
  k^2 - q^2 = (a_h^2 - 1) s |omega| / |a_h|); V[d+i, d+i] = sqrt(|mu_i| / |b_h|),
  O[i, d+i] = |b_h| V[d+i, d+i] (so mu keeps its default value and O_h != V_h^T).

Prompts of the decomposable multi-task linear regression (docs/model.md, Setting).

One prompt: x_1 .. x_L, q i.i.d. N(0, I_d); task parameters g_i ~ N(0, I_{r_i}) fresh per
prompt, independent across tasks; labels y_{l,i} = g_i^T Phi_i^T x_l + eps_{l,i},
eps ~ N(0, sigma^2); target y_{q,i} = g_i^T Phi_i^T q (noiseless).  Tokens z_l = (x_l, y_l),
query token z_q = (q, 0).

Written as one matrix per prompt: y_l = B^T x_l + eps_l with B = Phi diag(g) E (d x m),
E the task indicator (E[k, i] = 1 iff basis coordinate k belongs to task i).

The stream (version ``STREAM_VERSION`` = 3; version 1 drew the whole batch from the caller's
generator in one thread, version 2 from torch Mersenne Twisters keyed per chunk of 256
prompts).  The caller's ``torch.Generator`` fixes the stream:

- CPU: each call draws one 63-bit key from the caller's generator (so its state advances by
  the same amount whatever the batch, sigma or thread count, and a saved generator state
  resumes the stream bit-identically).  The key seeds two sub-streams (numpy's PCG64DXSM
  through SeedSequence(key, spawn_key=(s,))): s = 0 holds x, q, g, s = 1 the noise eps.
  Prompt p owns a fixed block of each sub-stream, its row p (:func:`_gaussian_rows`: words
  p W .. (p + 1) W - 1, W = ceil(count / 2) for L d + 2 d Gaussians x, q, g, resp. L m for
  eps), turned into Gaussians by Box-Muller on 24-bit uniforms.  Counter-based: a prompt's
  numbers depend only on the key and its index p (the generator is advanced to the row, in
  O(log) time), never on which thread draws it or on how the batch is split, so 1 or N
  threads give the same batch, and the first k prompts of any batch are the batch of k (the
  batch-prefix property, for every k).  The rows are drawn in chunks of about
  ``CHUNK_GAUSSIANS`` Gaussians (a unit of work only) on a thread pool of ``threads``
  workers (default ``torch.get_num_threads()``; numpy's generators and ufuncs release the
  GIL); each chunk's tokens are written on the caller's thread, by one batched matmul
  (:func:`_write_chunk`), as soon as the pool has drawn it.
  Because eps has its own sub-stream, x, q, g do not depend on whether eps was drawn: it is
  skipped when sigma = 0 and runs that differ only in sigma still share x, q, g (common
  random numbers).
  Why not torch's own CPU sampler (version 2): it needed torch's private generator layout to
  key chunks; PCG64DXSM rows are keyed by numpy's public API at about the same cost (3.3-4.4
  ns a Gaussian against torch's 3.8-4.3).  What makes a batch cheaper: drawing into a reused
  output (``out=``, no fresh pages), one matmul per chunk for its tokens, float64 runs' draws
  cast in the last Box-Muller pass, equal chunks and token maps made once per problem and
  thread (:func:`_token_maps`) (docs/performance.md).
- CUDA: one stream from the caller's device generator, no threads (the GPU draws in
  parallel), in the fixed order x, q, g, eps; eps is drawn even when sigma = 0 (it costs a
  GPU microseconds, and skipping it would shift the generator and so the next call's x, q, g
  between runs that differ only in sigma).  Unchanged since version 2.

CPU and CUDA give different streams for the same seed.  The Gaussians are drawn in float32
and cast to cfg.dtype (see ``_normal`` and ``_gaussian_rows``), so float32 and float64 runs
see the same data.

``symmetrize=True`` applies the per-task sign-flip group {+-1}^m (y_i, g_i, eps_i -> -)
to each drawn prompt and returns all 2^m images, so that sign-flip identities (the reason
the cross blocks of the gradient vanish) hold exactly on the finite batch.
"""
from __future__ import annotations

import functools
import itertools
import json
import math
import numbers
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import Optional

import numpy as np
import torch

from theory import check_positive_int, check_sigma, check_tasks
from numerics.io import SEED_MAX, check_device_option as check_device


BASES = ("identity", "random")
PARAMS = ("factored", "merged")
INITS = ("decomposable", "random_decomposable", "given", "random_full", "uniform_full", "unbalanced_decomposable",
         "linear_default", "authors_small")
DTYPES = ("float32", "float64")


def use_precise_float32() -> dict:
    """Switch TF32 off so that float32 matmuls are IEEE float32 on every device (the
    precision checks need true float32/float64): the project's one TF32 policy, called by
    the trainer before every run (and meant for the benchmark).  Uses the
    ``fp32_precision = "ieee"`` API where this torch has it (new torch refuses to read the
    legacy ``allow_tf32`` flags when they disagree with it), else the legacy flags.
    Returns the settings in force (for a benchmark's record)."""
    torch.set_float32_matmul_precision("highest")
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.fp32_precision = "ieee"
        return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
                "cuda.matmul.fp32_precision": torch.backends.cuda.matmul.fp32_precision,
                "cudnn.fp32_precision": torch.backends.cudnn.fp32_precision}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return {"float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda.matmul.allow_tf32": False, "cudnn.allow_tf32": False}


@lru_cache(maxsize=64)
def _haar_orthogonal(d: int, seed: int) -> np.ndarray:
    """A Haar-distributed orthogonal d x d matrix: QR of a Gaussian matrix with the signs of
    R's diagonal moved into Q (without that fix the law of Q is not Haar).  numpy's PCG64 so
    that Phi is the same on every device and torch version."""
    Qm, R = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    Qm = Qm * np.sign(np.diag(R))[None, :]
    Qm.setflags(write=False)
    return Qm


def _check_matrix(name: str, value, H: int, m: int) -> tuple:
    """A (H x m) nested tuple of finite floats, or a clear error."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an H x m = {H} x {m} array of real numbers, got {value!r}") from None
    if arr.shape != (H, m):
        raise ValueError(f"{name} must have shape (heads, m) = ({H}, {m}), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr.tolist()}")
    return tuple(tuple(float(v) for v in row) for row in arr)


@dataclass(frozen=True)
class ProblemConfig:
    tasks: tuple[int, ...]            # block sizes r_i >= 1; m = len(tasks) >= 1
    heads: int                        # H >= 1
    L: int                            # context length >= 1
    sigma: float = 0.0                # label noise std >= 0, finite
    basis: str = "identity"           # "identity" | "random" (seeded Haar orthonormal Phi)
    basis_seed: int = 0
    param: str = "factored"           # "factored" (K,Q,V,O) | "merged" (W,U)
    logit_scale: float = 1.0          # s in W_h = K_h^T Q_h / s  (factored only)
    init: str = "decomposable"        # "decomposable" | "random_decomposable" | "given" | "random_full"
                                      # | "uniform_full" | "unbalanced_decomposable" | "linear_default"
                                      # | "authors_small" (module docstring)
    init_scale: float = 0.15          # s0 of the default init
    init_omega: Optional[tuple] = None  # H x m nested tuples, with init="given"
    init_mu: Optional[tuple] = None
    init_seed: int = 0
    dtype: str = "float64"            # "float32" | "float64"
    device: str = "cpu"               # "cpu" | "cuda" | "cuda:N"

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen dataclass
        # tasks, heads, L, sigma: the one set of checks, theory's (the same messages)
        one_block = isinstance(self.tasks, numbers.Integral) and not isinstance(self.tasks, bool)
        set_("tasks", check_tasks((self.tasks,) if one_block else self.tasks))
        set_("heads", check_positive_int("heads", self.heads))
        set_("L", check_positive_int("L", self.L))
        set_("sigma", check_sigma(self.sigma))
        for name, allowed in (("basis", BASES), ("param", PARAMS), ("init", INITS), ("dtype", DTYPES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name, shown in (("logit_scale", "logit_scale s"), ("init_scale", "init_scale")):
            v = getattr(self, name)
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{shown} must be a finite number > 0, got {v!r}")
            set_(name, float(v))
        for name in ("basis_seed", "init_seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 0 or v > SEED_MAX:
                raise ValueError(f"{name} must be an integer in 0 .. 2^64 - 1 (a 64-bit seed), got {v!r}")
            set_(name, int(v))
        if self.init == "given":
            if self.init_omega is None or self.init_mu is None:
                raise ValueError("init='given' needs both init_omega and init_mu (H x m nested tuples)")
            set_("init_omega", _check_matrix("init_omega", self.init_omega, self.heads, self.m))
            set_("init_mu", _check_matrix("init_mu", self.init_mu, self.heads, self.m))
        elif self.init_omega is not None or self.init_mu is not None:
            raise ValueError(f"init_omega/init_mu are only used with init='given', but init={self.init!r}; "
                             "set init='given' or drop them")
        if self.init == "unbalanced_decomposable" and self.param != "factored":
            raise ValueError("init='unbalanced_decomposable' needs param='factored' (merged weights have no "
                             "factors to unbalance); use init='decomposable' with param='merged'")
        if self.init in ("linear_default", "authors_small") and self.param != "factored":
            raise ValueError(f"init={self.init!r} is defined on the factors K, Q, V, O of the authors' module and "
                             "needs param='factored'; merged weights have no factors")
        set_("device", check_device(self.device, "device"))

    # --- derived quantities -------------------------------------------------------------
    @property
    def d(self) -> int:
        return sum(self.tasks)

    @property
    def m(self) -> int:
        return len(self.tasks)

    @property
    def token_dim(self) -> int:
        return self.d + self.m

    @property
    def torch_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == "float64" else torch.float32

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device)

    @property
    def block_slices(self) -> tuple[slice, ...]:
        """Columns of Phi (coordinates in the task basis) owned by each task."""
        edges = np.concatenate([[0], np.cumsum(self.tasks)])
        return tuple(slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:]))

    def basis_numpy(self) -> np.ndarray:
        """Phi as a float64 numpy array (d x d, orthonormal columns grouped by task)."""
        if self.basis == "identity":
            return np.eye(self.d)
        return _haar_orthogonal(self.d, self.basis_seed)

    def basis_matrix(self) -> torch.Tensor:
        """Phi (d x d, columns = basis vectors, grouped by task) in cfg's dtype and device."""
        return torch.tensor(self.basis_numpy(), dtype=self.torch_dtype, device=self.device)

    def task_indicator(self) -> torch.Tensor:
        """E (d x m): E[k, i] = 1 if basis coordinate k belongs to task i."""
        E = torch.zeros(self.d, self.m, dtype=self.torch_dtype, device=self.device)
        for i, sl in enumerate(self.block_slices):
            E[sl, i] = 1.0
        return E

    def replace(self, **changes) -> "ProblemConfig":
        """A copy with some fields changed (validated again)."""
        return ProblemConfig(**{**self.to_dict(), **changes}) if changes else self

    # --- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict:
        """The fields as JSON data (tuples as lists)."""
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_dict(cls, d: dict) -> "ProblemConfig":
        """The configuration of a dict (from JSON or a grid file; lists where tuples were, which
        construction turns into tuples), refused when it has keys that are not fields."""
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown {cls.__name__} field(s) {sorted(unknown)}; known fields: "
                             f"{sorted(f.name for f in fields(cls))}")
        return cls(**d)


STREAM_VERSION = 3
"""Version of the prompt stream (1: one sequential draw per call; 2: torch Mersenne Twisters
keyed per chunk; 3: PCG64DXSM rows keyed per prompt, see the module docstring).  A checkpoint
written under another version cannot resume this stream."""

CHUNK_GAUSSIANS = 2 ** 18
"""Gaussians per unit of work of the CPU sampler (:func:`chunk_rows` prompts; not part of the
stream's definition).  2^18 float32 values (1 MiB, a few such buffers in flight) stay in a
core's L2 cache while the per-chunk overhead (a generator state, ~25 numpy and torch calls,
~0.1 ms) stays below 10 % of the chunk's draws."""


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


# --- counter-based Gaussians --------------------------------------------------------------------

def _substream(key: int, substream: int) -> np.random.PCG64DXSM:
    """The bit generator of sub-stream ``substream`` (0: x, q, g; 1: eps) of the call with
    ``key``: numpy's PCG64DXSM seeded through SeedSequence(key, spawn_key=(substream,)),
    numpy's construction for statistically independent streams (the key's 63 bits and the
    sub-stream index are hashed into the generator's 128-bit state and increment)."""
    return np.random.PCG64DXSM(np.random.SeedSequence(key, spawn_key=(substream,)))


def words_per_prompt(count: int) -> int:
    """64-bit words of a prompt's sub-stream that holds ``count`` Gaussians: one word per
    Box-Muller pair, so ceil(count / 2) (a prompt's last Gaussian is dropped when count is odd)."""
    return (count + 1) // 2


_local = threading.local()


def _scratch_generator() -> np.random.PCG64DXSM:
    """This thread's generator to copy a sub-stream's state into (constructing one costs a
    SeedSequence hash, ~10 us; setting a state ~2 us)."""
    gen = getattr(_local, "generator", None)
    if gen is None:
        gen = _local.generator = np.random.PCG64DXSM(0)
    return gen


_BLOCK_PAIRS = 2 ** 14
"""Box-Muller pairs per block of :func:`_gaussian_rows` (whole rows, at least one): its five
float32 passes over a block of 64 KiB arrays stay in a core's L2 cache; over a whole chunk
(MiBs) every pass would stream from L3 (measured 2x slower)."""


def _scratch(block: int, rows: int, words: int, slot: int, dtype=np.float32) -> tuple:
    """This thread's work arrays for :func:`_gaussian_rows`: a block's float32 (2, block, words)
    and (block, words), and the result (rows, 2, words) in ``dtype`` of ``slot`` (0: x, q, g; 1:
    eps), reused (fresh arrays are fresh pages, whose faults cost as much as the arithmetic):
    a result is valid only until the thread's next call with that slot."""
    cache = _local.__dict__.setdefault("scratch", {})
    key = (block, rows, words, slot, np.dtype(dtype).char)
    if key not in cache:
        if len(cache) >= 4:          # a few shapes per thread (x/q/g and eps, the last chunk)
            cache.clear()
        cache[key] = (np.empty((2, block, words), np.float32), np.empty((block, words), np.float32),
                      np.empty((rows, 2, words), dtype))
    return cache[key]


_RADIUS_SCALE = np.float32(-2.0 ** -24)
_ANGLE_SCALE = np.float32(2.0 * np.pi * 2.0 ** -24)


def _gaussian_rows(stream: np.random.PCG64DXSM, first: int, rows: int, words: int,
                   private: bool = False, slot: int = 0, dtype=np.float32) -> np.ndarray:
    """Rows ``first`` .. ``first + rows - 1`` of a sub-stream, (rows, 2 words) float32 N(0, 1)
    (stored as ``dtype``: float64 holds the same float32 values, cast in the last pass):
    this thread's scratch memory ``slot`` (:func:`_scratch`: valid until the thread's next call
    with that slot), or a new array if ``private`` (a pool thread's result, read after its next
    call).

    Row p (a prompt) is made of the stream's 64-bit words p * words .. (p + 1) * words - 1
    (a copy of ``stream`` is advanced to the row's first word: any row is drawn without the
    ones before it).  Those words are 2 words uint32 halves u_0 .. u_{2 words - 1} (little-
    endian); the top 24 bits of each give a uniform U = (u >> 8) 2^-24 in [0, 1 - 2^-24], and
    Box-Muller pairs the first half with the second: with R_j = sqrt(-2 log(1 - U_j)) (1 - U_j
    formed exactly in float32, then numpy's log (log1p(-U_j) gives the same numbers
    to ~4 ulp, as another CPU's vectorised functions give, so the same stream version, but
    log1p has no SIMD loop on AVX2 and took 12 of the 17 ns a Gaussian there)) and
    theta_j = 2 pi U_{words + j}, the row is (R_j cos theta_j)_j followed by (R_j sin theta_j)_j.
    Float32 throughout (numpy's vectorised log1p, sqrt, cos, sin: a few ulp): the draws are
    N(0, 1) to 24 bits, |z| <= sqrt(2 ln 2^24) = 5.77 (a tail of mass 8e-9 dropped), as the
    float32 sampler of torch these replace.  Every elementwise pass runs over contiguous,
    cache-sized blocks (numpy's vectorised loops are 3-4x slower on the rows' strided halves,
    and 2x slower over blocks that do not fit in L2)."""
    gen = _scratch_generator()
    gen.state = stream.state
    gen.advance(first * words)
    bits = gen.random_raw(rows * words).view(np.uint32)
    np.right_shift(bits, 8, out=bits)
    bits = bits.view(np.int32).reshape(rows, 2, words)
    step = max(1, _BLOCK_PAIRS // words)                      # rows per cache-sized block
    u, trig, out = _scratch(min(step, rows), rows, words, slot, dtype)
    if private:
        out = np.empty_like(out)
    for a in range(0, rows, step):
        b = min(rows, a + step)
        uu, tt = u[:, :b - a], trig[:b - a]
        # (rows, 2, words) -> (2, rows, words): all radii, then all angles, each contiguous
        np.copyto(uu, bits[a:b].transpose(1, 0, 2), casting="unsafe")
        radius, angle = uu[0], uu[1]
        np.multiply(radius, _RADIUS_SCALE, out=radius)       # -U
        np.add(radius, np.float32(1.0), out=radius)          # 1 - U, exact (a multiple of 2^-24 in (0, 1])
        np.log(radius, out=radius)                           # numpy's SIMD log: log1p(-U) is scalar on AVX2
        np.multiply(radius, np.float32(-2.0), out=radius)
        np.sqrt(radius, out=radius)
        np.multiply(angle, _ANGLE_SCALE, out=angle)
        np.cos(angle, out=tt)
        np.multiply(tt, radius, out=out[a:b, 0], dtype=np.float32)   # a float32 product, then cast
        np.sin(angle, out=tt)
        np.multiply(tt, radius, out=out[a:b, 1], dtype=np.float32)
    return out.reshape(rows, 2 * words)


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
    # float32 draws (torch's float64 sampler is ~4x slower), cast by _assemble: N(0, 1) to 24
    # bits, |z| <= 5.77 (a tail of 8e-9 dropped), far below any Monte-Carlo error here
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


def _token_maps(cfg: ProblemConfig, k: int) -> tuple:
    """(E, Phi or None, [I | *] (k, d, d+m), [0 | sigma I] (k, m, d+m) or None): the fixed parts
    of :func:`_write_chunk`'s maps for chunks of at most k prompts, made once per (cfg, k) and
    thread (at a small batch their ~15 torch calls cost more than the draws); a chunk
    overwrites only the right block of [I | *], on the caller's thread, before reading it."""
    cache = _local.__dict__.setdefault("maps", {})
    if (cfg, k) not in cache:
        d, m, dt = cfg.d, cfg.m, cfg.torch_dtype
        tokens = torch.cat([torch.eye(d, dtype=dt).expand(k, d, d), torch.zeros(k, d, m, dtype=dt)], dim=2)
        noise = torch.cat([torch.zeros(m, d, dtype=dt), cfg.sigma * torch.eye(m, dtype=dt)], dim=1)
        if len(cache) >= 8:                  # a few problems per thread
            cache.clear()
        cache[cfg, k] = (cfg.task_indicator(), cfg.basis_matrix() if cfg.basis != "identity" else None, tokens,
                         noise.expand(k, m, d + m) if cfg.sigma > 0 else None)
    return cache[cfg, k]


def _write_chunk(z: np.ndarray, eps: np.ndarray | None, cfg: ProblemConfig, maps: tuple,
                 context: torch.Tensor, query: torch.Tensor, target: torch.Tensor) -> None:
    """A chunk's prompts from its rows: z (k, 2 W) of sub-stream 0 (x, q, g), eps (k, 2 W') of
    sub-stream 1 or None (cfg.dtype), into context (k, L, d+m), query (k, d+m), target (k, m);
    ``maps``: :func:`_token_maps`'.  The whole token z_l = (x_l, y_l) is one batched matmul into
    the (contiguous) context: z_l^T = x_l^T [I | B] + sigma eps_l^T [0 | I], B = Phi diag(g) E,
    so x is copied exactly (x 1 + 0s) and y_l = B^T x_l + sigma eps_l -- cheaper than strided
    copies of x and y into the context (a strided copy pays per token)."""
    d, m, L = cfg.d, cfg.m, cfg.L
    k = z.shape[0]
    zt = torch.from_numpy(z)
    x = zt[:, :L * d].unflatten(1, (L, d))
    q, g = zt[:, L * d:L * d + d], zt[:, L * d + d:L * d + 2 * d]
    E, Phi, tokens, noise = maps
    tokens = tokens[:k]
    coef = tokens[:, :, d:]
    torch.mul(g[:, :, None], E, out=coef)                   # diag(g) E: (k, d, m)
    if Phi is not None:
        coef.copy_(Phi @ coef)                              # B = Phi diag(g) E
    torch.bmm(x, tokens, out=context)
    if eps is not None:
        e = torch.from_numpy(eps)[:, :L * m].unflatten(1, (L, m))
        context.baddbmm_(e, noise[:k])
    query[:, :d] = q
    query[:, d:] = 0
    torch.bmm(q[:, None, :], coef, out=target[:, None, :])


def _empty_prompts(cfg: ProblemConfig, n: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    dt = cfg.torch_dtype
    return (torch.empty(n, cfg.L, cfg.token_dim, dtype=dt, device=device),
            torch.empty(n, cfg.token_dim, dtype=dt, device=device),
            torch.empty(n, cfg.m, dtype=dt, device=device))


def one_thread(fn):
    """Run ``fn`` with one torch intra-op thread (restored afterwards).  Where the work is many
    small tensor ops, thread hand-offs cost more than they gain on shared cores: each op becomes
    a parallel region waiting for a descheduled thread (the sampler's labels: 600 ms instead of
    150 ms a batch of 4096 on 2 loaded cores, while its own threads keep the cores busy; the
    reduced minimisers' batched matmuls: one single-head minimisation 3.3 s against 0.2 s)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn(*args, **kwargs)
        finally:
            torch.set_num_threads(before)

    return wrapper


def chunk_rows(cfg: ProblemConfig) -> int:
    """Prompts per unit of work of the CPU sampler: about CHUNK_GAUSSIANS Gaussians (at least
    one prompt).  Only the work is split by it; the numbers do not depend on it."""
    return max(1, CHUNK_GAUSSIANS // (2 * words_per_prompt(cfg.L * cfg.d + 2 * cfg.d)))


def _sample_keyed(cfg: ProblemConfig, n: int, generator: torch.Generator, threads: int,
                  context: torch.Tensor, query: torch.Tensor, target: torch.Tensor) -> None:
    """The CPU stream, written into context (n, L, d+m), query (n, d+m), target (n, m): one
    key from ``generator``; prompt p's x, q, g are row p of sub-stream 0 (L d + 2 d Gaussians,
    in this order), its eps row p of sub-stream 1 (L m, drawn only when sigma > 0)
    (:func:`_gaussian_rows`).  The rows are drawn in chunks of :func:`chunk_rows` prompts on
    a pool of ``threads`` threads (numpy releases the GIL); each chunk is written into the
    prompts on the caller's thread (:func:`_write_chunk`, on one torch thread: :func:`one_thread`) as soon
    as it is drawn, while the pool draws the next ones."""
    key = int(torch.randint(0, 2 ** 63 - 1, (), generator=generator, dtype=torch.int64))
    main, w_main = _substream(key, 0), words_per_prompt(cfg.L * cfg.d + 2 * cfg.d)
    noise, w_noise = _substream(key, 1) if cfg.sigma > 0 else None, words_per_prompt(cfg.L * cfg.m)
    n_chunks = -(-n // chunk_rows(cfg))
    rows = -(-n // n_chunks)                         # equal chunks: no small last one
    pooled = threads > 1 and n_chunks > 1           # a pool thread's rows are read after its next call
    np_dtype = np.float64 if cfg.torch_dtype == torch.float64 else np.float32

    def draw(c: int):                                # numpy only: the GIL is released
        first = c * rows
        k = min(n, first + rows) - first
        return (_gaussian_rows(main, first, k, w_main, pooled, dtype=np_dtype), None if noise is None else
                _gaussian_rows(noise, first, k, w_noise, pooled, slot=1, dtype=np_dtype))

    chunks = _thread_pool(threads).map(draw, range(n_chunks)) if pooled else map(draw, range(n_chunks))
    @one_thread
    def write_chunks():
        maps = _token_maps(cfg, rows)
        for c, (z, eps) in enumerate(chunks):       # in order; the pool re-raises
            k = slice(c * rows, min(n, (c + 1) * rows))
            _write_chunk(z, eps, cfg, maps, context[k], query[k], target[k])
    write_chunks()


def _sample_on_device(cfg: ProblemConfig, n: int, generator: torch.Generator, context: torch.Tensor,
                      query: torch.Tensor, target: torch.Tensor) -> None:
    """The device (CUDA) stream, written into context, query, target: float32 draws x, q, g, eps
    from ``generator`` in this order, eps always (so the generator advances by the same amount
    whatever sigma), assembled in one pass (:func:`_assemble`)."""
    d, m, L, dev = cfg.d, cfg.m, cfg.L, generator.device
    x, q, g, eps = (_normal(shape, generator, dev) for shape in ((n, L, d), (n, d), (n, d), (n, L, m)))
    Phi = cfg.basis_matrix().to(dev) if cfg.basis != "identity" else None
    _assemble(x, q, g, eps, cfg, cfg.task_indicator().to(dev), Phi, context, query, target)


def sample_prompts(cfg: ProblemConfig, batch: int, generator: torch.Generator,
                   symmetrize: bool = False, *, threads: int | None = None,
                   out: Prompts | None = None) -> Prompts:
    """Draw ``batch`` prompts of cfg's problem on cfg.device with ``generator`` (stream
    version STREAM_VERSION, see the module docstring; one call advances ``generator`` by a
    fixed amount).

    With ``symmetrize``, batch/2^m prompts are drawn and each is returned under all 2^m
    per-task sign flips (image k of prompt p at index k * batch/2^m + p).  ``threads``: CPU
    threads drawing the chunks (default torch.get_num_threads(); the numbers do not depend
    on it).  ``out``: a Prompts of this batch's shapes, dtype and device (the previous call's,
    once it is no longer needed) whose tensors are overwritten and returned instead of new
    ones: the same numbers, without the page faults of fresh memory (a third of a batch's
    cost at tasks 4,4,4, L = 256, batch 4096)."""
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
    out = out if out is not None else Prompts(*_empty_prompts(cfg, batch, cfg.device))
    context, query, target = out.context, out.query, out.target
    n = batch // n_flips if symmetrize else batch
    if generator.device.type == "cpu":
        _sample_keyed(cfg, n, generator, int(threads), context[:n], query[:n], target[:n])
    else:
        _sample_on_device(cfg, n, generator, context[:n], query[:n], target[:n])
    if symmetrize:
        # flipping task i's sign maps (g_i, eps_i) -> -(g_i, eps_i): y_i, y_{q,i} -> -y_i, -y_{q,i};
        # image k of prompt p at k n + p (image 0, the identity, is the drawn prompt itself)
        d = cfg.d
        s = sign_flips(cfg.m, cfg.torch_dtype, cfg.device)      # (2^m, m)
        for k in range(1, n_flips):
            img = slice(k * n, (k + 1) * n)
            context[img, :, :d] = context[:n, :, :d]
            torch.mul(context[:n, :, d:], s[k], out=context[img, :, d:])
            query[img] = query[:n]
            torch.mul(target[:n], s[k], out=target[img])
    return Prompts(context=context, query=query, target=target)
