"""The problem configuration: tasks, heads, context length, noise, basis, parametrisation,
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
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, fields
from functools import lru_cache
from typing import Optional

import numpy as np
import torch

from theory._validate import check_positive_int, check_sigma, check_tasks
from numerics.io import SEED_MAX, check_device_option as check_device

BASES = ("identity", "random")
PARAMS = ("factored", "merged")
INITS = ("decomposable", "random_decomposable", "given", "random_full", "uniform_full", "unbalanced_decomposable",
         "linear_default", "authors_small")
DTYPES = ("float32", "float64")


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


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
    rng = np.random.default_rng(seed)
    A = rng.standard_normal((d, d))
    Qm, R = np.linalg.qr(A)
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


def check_known_fields(cls, d: dict) -> None:
    """Refuse a dict (from JSON or a grid file) with keys that are not fields of the dataclass."""
    known = {f.name for f in fields(cls)}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {sorted(unknown)}; known fields: {sorted(known)}")


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
        # tasks, heads, L, sigma: the one set of checks, theory._validate (same messages as theory)
        tasks = (self.tasks,) if _is_int(self.tasks) else self.tasks
        set_("tasks", check_tasks(tasks))
        set_("heads", check_positive_int("heads", self.heads))
        set_("L", check_positive_int("L", self.L))
        set_("sigma", check_sigma(self.sigma))
        for name, allowed in (("basis", BASES), ("param", PARAMS), ("init", INITS), ("dtype", DTYPES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        for name, shown in (("logit_scale", "logit_scale s"), ("init_scale", "init_scale")):
            v = getattr(self, name)
            if not _is_real(v) or not math.isfinite(v) or v <= 0:
                raise ValueError(f"{shown} must be a finite number > 0, got {v!r}")
            set_(name, float(v))
        for name in ("basis_seed", "init_seed"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0 or v > SEED_MAX:
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
        out = asdict(self)
        out["tasks"] = list(self.tasks)
        for k in ("init_omega", "init_mu"):
            if out[k] is not None:
                out[k] = [list(row) for row in out[k]]
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "ProblemConfig":
        check_known_fields(cls, d)
        d = dict(d)
        if "tasks" in d and isinstance(d["tasks"], list):
            d["tasks"] = tuple(d["tasks"])
        for k in ("init_omega", "init_mu"):
            if d.get(k) is not None:
                d[k] = tuple(tuple(row) for row in d[k])
        return cls(**d)
