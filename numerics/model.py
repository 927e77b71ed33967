"""The model: the full one-layer multi-head softmax attention, its exact finite-L reduced model on
the decomposable set D, and exact symmetrisation of a batch.

The full model: one layer of H softmax-attention heads, nothing else.

    y_hat = sum_h U_h sum_l softmax_l(z_l^T W_h z_q) z_l,

the query z_q = (q, 0) attending over the L context tokens only.  Factored:
W_h = K_h^T Q_h / s, U_h = O_h V_h (every entry of K, Q, V, O trainable); merged: W_h, U_h
trainable.  s = cfg.logit_scale.

Since the query is a single token, the forward pass never projects the context tokens:
a_h = W_h[:, :d] q (only the x part of z_q is nonzero), logits_hl = z_l^T a_h for all heads
in one batched matmul, softmax over l (max subtracted, so saturated logits cannot overflow),
c_h = sum_l p_hl z_l, y_hat = sum_h U_h c_h.  The merged weights are formed once per step
(H (d+m)^3 flops, independent of the batch).

Decomposable set D (docs/model.md): W_XX = sum_i omega_i Phi_i Phi_i^T, every other block of W
zero; U = [0 | diag(mu)].  The balanced factored point of D with values (omega, mu):
K_XX = sum_i sign(omega_i) sqrt(s |omega_i|) Phi_i Phi_i^T, Q_XX = sum_i sqrt(s |omega_i|)
Phi_i Phi_i^T, V[d+i, d+i] = sqrt|mu_i|, O[i, d+i] = sign(mu_i) sqrt|mu_i|, zero elsewhere.

The exact finite-L reduced model on the semi-singular values (docs/model.md).

At the point of D with values (omega, mu) the full model predicts

    y_hat_i = sum_h mu[h,i] sum_l p_hl y_{l,i},   p_h = softmax_l( sum_j omega[h,j] s_{l,j} ),

with the per-block scores s_{l,j} = <Phi_j^T x_l, Phi_j^T q> (no expansion in 1/L).  This
prediction formula has ONE definition here: :func:`attention_weights` (p from the scores)
and :func:`predict_from_scores` (y_hat from p and the labels).  :func:`reduced_predict`
computes the scores of whole prompts (:func:`block_scores`) and applies it;
``numerics.exact_reduced`` draws the scores directly (a Rao-Blackwellised estimator that
integrates the labels out analytically) and uses the same :func:`attention_weights`.

L_L(omega, mu) = E ||y_q - y_hat||^2 is estimated by :func:`reduced_loss`, its gradient by
:func:`reduced_gradient` (autograd); on the same batch the full model's gradient at that
point, projected onto D, equals it by the chain rule (tests/test_numerics_reduced.py).

Gradient flow of the full weights moves the values with the metric factors of
``theory.reduced_ode.metric_factors`` (the one definition; :func:`metric_factors` here only
converts to and from torch): merged f_omega = 1/r_i, f_mu = 1; factored balanced
f_omega = 2|omega_i|/(s r_i), f_mu = 2|mu_i|.

Exact symmetrisation of a batch of prompts under the finite group G of
``theory.block_structure.symmetry_group`` (whose fixed set is the decomposable set D).

On a batch made of whole G-orbits the gradient of the full model at a point of D lies in D
exactly (to rounding), so gradient descent never leaves D: the claims use it to separate
the symmetry argument from Monte-Carlo noise.  (``numerics.config.sample_prompts(...,
symmetrize=True)`` applies only the per-task output sign flips, a subgroup.)
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from theory.reduced_ode import decomposable_residual, default_init, semi_singular_values
from theory.reduced_ode import metric_factors as theory_metric_factors

from .config import ProblemConfig, Prompts


class TrainingDiverged(RuntimeError):
    """The loss (or the weights) became non-finite, or the loss exceeded the run's
    ``diverge_loss``: the one divergence error of numerics (raised by the trainer, and by a
    readout of weights that are no longer finite)."""


@dataclass
class Readout:
    omega: np.ndarray     # (H, m): tr(Phi_i^T W_XX Phi_i) / r_i
    mu: np.ndarray        # (H, m): (U_Y)_ii
    residual: float       # ||(W,U) - P_D(W,U)|| / ||(W,U)|| on the merged weights


def mse_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """E ||y_q - y_hat||^2: mean over the batch of the squared error summed over tasks (shapes
    checked: (B, m) against (B, 1) would broadcast into a wrong number silently)."""
    if pred.shape != target.shape:
        raise ValueError(f"pred and target must have the same shape (B, m), got {tuple(pred.shape)} "
                         f"and {tuple(target.shape)}")
    return ((pred - target) ** 2).sum(dim=-1).mean()


def _as_matrix(name: str, value, cfg: ProblemConfig) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(value.detach().cpu() if torch.is_tensor(value) else value, dtype=float),
                        dtype=torch.float64)
    if t.shape != (cfg.heads, cfg.m):
        raise ValueError(f"{name} must have shape (heads, m) = ({cfg.heads}, {cfg.m}), got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} must be finite, got {t.tolist()}")
    return t


def initial_semi_singular_values(cfg: ProblemConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(omega, mu), each (H, m) float64 on the CPU, of cfg's decomposable initialisation.

    decomposable: omega = s0, mu = s0 with 2 s0 on task h mod m of head h;
    random_decomposable: i.i.d. uniform in [s0/2, 3 s0/2] (seed init_seed); given: as given.
    """
    H, m, s0 = cfg.heads, cfg.m, cfg.init_scale
    if cfg.init == "decomposable":          # theory's definition of the default start
        omega, mu = default_init(cfg.tasks, H, s0)
        return torch.tensor(omega, dtype=torch.float64), torch.tensor(mu, dtype=torch.float64)
    if cfg.init == "random_decomposable":
        gen = torch.Generator().manual_seed(cfg.init_seed)
        u = torch.rand(2, H, m, generator=gen, dtype=torch.float64)
        return s0 * (0.5 + u[0]), s0 * (0.5 + u[1])
    if cfg.init == "given":
        return (torch.tensor(cfg.init_omega, dtype=torch.float64),
                torch.tensor(cfg.init_mu, dtype=torch.float64))
    if cfg.init == "unbalanced_decomposable":  # the default values, omega's sign that of a_h
        omega, mu = default_init(cfg.tasks, H, s0)
        a, _ = unbalanced_factor_scales(cfg)
        return (torch.tensor(np.sign(a)[:, None] * omega, dtype=torch.float64),
                torch.tensor(mu, dtype=torch.float64))
    if cfg.init == "authors_small":            # its point on D (W's gradient-free y columns aside)
        a, c, v = authors_small_factors(cfg)
        omega = np.repeat((a ** 2 * c ** 2 / cfg.logit_scale)[:, None], m, axis=1)
        return torch.tensor(omega, dtype=torch.float64), torch.tensor(v ** 2, dtype=torch.float64)
    raise ValueError(f"init={cfg.init!r} is not a point of the decomposable set D; semi-singular "
                     "values exist only for 'decomposable', 'random_decomposable', 'given', "
                     "'unbalanced_decomposable' and 'authors_small'")




def initial_values(cfg: ProblemConfig) -> tuple[np.ndarray, np.ndarray]:
    """(omega, mu), each (H, m) float64 numpy, of cfg's initialisation
    (:func:`initial_semi_singular_values` as arrays: what theory's flows start from)."""
    return tuple(a.numpy().copy() for a in initial_semi_singular_values(cfg))


def unbalanced_factor_scales(cfg: ProblemConfig) -> tuple[np.ndarray, np.ndarray]:
    """(a, b), each (H,): the per-head factor scales of init='unbalanced_decomposable',
    i.i.d. N(0, 1) (seed cfg.init_seed; the authors multiply each head's K by a standard
    normal): K_h = a_h Q_h on X, O_h = |b_h| V_h^T on Y."""
    gen = np.random.default_rng(cfg.init_seed)
    ab = gen.standard_normal((2, cfg.heads))
    return ab[0], ab[1]


def authors_small_factors(cfg: ProblemConfig) -> tuple[np.ndarray, float, np.ndarray]:
    """(a, c, v) of init='authors_small' (numerics.config): a (H,) the per-head standard normals
    (seed cfg.init_seed, numpy's default_rng), c = init_scale L^(-3/4) the scale of K_h = Q_h =
    a_h c I_D, v (H, m) the Y diagonal of V_h and O_h: c, and 2c on task h mod m."""
    a = np.random.default_rng(cfg.init_seed).standard_normal(cfg.heads)
    c = cfg.init_scale * cfg.L ** -0.75
    v = np.full((cfg.heads, cfg.m), c)
    v[np.arange(cfg.heads), np.arange(cfg.heads) % cfg.m] = 2.0 * c
    return a, c, v


def factor_balance(model: "MultiHeadAttention") -> tuple[np.ndarray, np.ndarray]:
    """(c_omega, c_mu), each (H, m), of a factored model: with the per-block factor scalars
    k[h,i] = tr(Phi_i^T K_XX Phi_i)/r_i, q[h,i] likewise of Q, o[h,i] = O[h, i, d+i],
    v[h,i] = V[h, d+i, d+i]: c_omega = k^2 - q^2, c_mu = o^2 - v^2.  Gradient flow
    conserves both on D (dk/dt = -(q/(s r)) dL/domega, dq/dt = -(k/(s r)) dL/domega, so
    d(k^2 - q^2)/dt = 0; likewise o, v); 0 at the balanced points of D."""
    cfg = model.cfg
    d, m = cfg.d, cfg.m
    Phi = cfg.basis_numpy()
    with torch.no_grad():
        K, Q, V, O = (t.detach().to("cpu", torch.float64).numpy() for t in (model.K, model.Q, model.V, model.O))
    k, q = (np.stack([np.einsum("ak,hab,bk->h", Phi[:, sl], A[:, :d, :d], Phi[:, sl]) / (sl.stop - sl.start)
                      for sl in cfg.block_slices], axis=1) for A in (K, Q))
    idx = np.arange(m)
    o = O[:, idx, d + idx]
    v = V[:, d + idx, d + idx]
    return k ** 2 - q ** 2, o ** 2 - v ** 2


def attend(a: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """What each head reads from the context: c_g = sum_l softmax_l(z_l^T a_g) z_l for the
    head queries a (N, G, D) over the context tokens z (N, L, D); returns (N, G, D).

    The one place the attention is computed, for the single model and the batched trainer
    alike.  The softmax runs over the last, contiguous axis (over a strided middle axis
    torch's CPU softmax was 3x slower than everything else in a step) and subtracts its
    maximum, so saturated logits cannot overflow."""
    p = torch.softmax(torch.bmm(a, context.transpose(1, 2)), dim=-1)
    return torch.bmm(p, context)


class MultiHeadAttention(torch.nn.Module):
    """H softmax-attention heads, one layer; predictions (B, m) for (context, query)."""

    def __init__(self, cfg: ProblemConfig):
        super().__init__()
        self.cfg = cfg
        H, D, m = cfg.heads, cfg.token_dim, cfg.m
        opts = dict(dtype=cfg.torch_dtype, device=cfg.device)
        if cfg.param == "factored":
            self.K = torch.nn.Parameter(torch.zeros(H, D, D, **opts))
            self.Q = torch.nn.Parameter(torch.zeros(H, D, D, **opts))
            self.V = torch.nn.Parameter(torch.zeros(H, D, D, **opts))
            self.O = torch.nn.Parameter(torch.zeros(H, m, D, **opts))
        else:
            self.W = torch.nn.Parameter(torch.zeros(H, D, D, **opts))
            self.U = torch.nn.Parameter(torch.zeros(H, m, D, **opts))
        if cfg.init in ("random_full", "uniform_full", "linear_default"):
            self._init_iid()
        elif cfg.init == "authors_small":
            self._init_authors_small()
        else:
            self._set_semi_singular_values(*initial_semi_singular_values(cfg))
            if cfg.init == "unbalanced_decomposable":
                self._unbalance(*unbalanced_factor_scales(cfg))

    # --- initialisation ---------------------------------------------------------------------
    @torch.no_grad()
    def _set_semi_singular_values(self, omega: torch.Tensor, mu: torch.Tensor) -> None:
        """Put the weights at the (balanced, if factored) point of D with values (omega, mu)."""
        cfg = self.cfg
        d, m, s = cfg.d, cfg.m, cfg.logit_scale
        Phi = torch.tensor(cfg.basis_numpy(), dtype=torch.float64)
        E = cfg.task_indicator().cpu().double()                    # (d, m)
        omega_coord = omega @ E.T                                   # (H, d): omega of each basis vector
        mu = mu.double()
        proj = lambda diag: torch.einsum("ak,hk,bk->hab", Phi, diag, Phi)  # noqa: E731  Phi diag Phi^T
        idx = torch.arange(m)
        H, D = cfg.heads, cfg.token_dim
        W, U = torch.zeros(H, D, D, dtype=torch.float64), torch.zeros(H, m, D, dtype=torch.float64)
        if cfg.param == "merged":
            W[:, :d, :d] = proj(omega_coord)
            U[:, idx, d + idx] = mu
            values = {"W": W, "U": U}
        else:
            root = torch.sqrt(s * omega_coord.abs())
            K, Q, V, O = W, torch.zeros_like(W), torch.zeros_like(W), U
            K[:, :d, :d] = proj(torch.sign(omega_coord) * root)
            Q[:, :d, :d] = proj(root)
            V[:, d + idx, d + idx] = mu.abs().sqrt()
            O[:, idx, d + idx] = torch.sign(mu) * mu.abs().sqrt()
            values = {"K": K, "Q": Q, "V": V, "O": O}
        for name, value in values.items():
            getattr(self, name).copy_(value)

    @torch.no_grad()
    def _init_iid(self) -> None:
        """Every entry i.i.d. (seed init_seed), D = d+m:

        - ``random_full``: Gaussian, so that W_h, U_h have entries of std ~ s0/sqrt(D): merged,
          W, U entries N(0, s0^2/D); factored, K, Q entries N(0, s s0 / D) give
          (K^T Q / s)_ab = sum_k K_ka Q_kb / s with std sqrt(D) (s s0/D) / s = s0/sqrt(D), and V, O
          entries N(0, s0/D) give U = O V entries of std s0/sqrt(D) likewise;
        - ``uniform_full``: uniform on [-s0/sqrt(D), s0/sqrt(D)] (s0 = 1 is nn.Linear's default bound
          1/sqrt(fan_in), kaiming_uniform with a = sqrt(5));
        - ``linear_default``: nn.Linear's default on each of the authors' projections, times s0:
          U(-s0/sqrt(fan_in), s0/sqrt(fan_in)), q_proj, k_proj, v_proj reading a token (fan_in D),
          o_proj the H heads' concatenated outputs (fan_in H D)."""
        cfg = self.cfg
        D, H, s0, s = cfg.token_dim, cfg.heads, cfg.init_scale, cfg.logit_scale
        if cfg.init == "random_full":
            scale = ({"W": s0 / math.sqrt(D), "U": s0 / math.sqrt(D)} if cfg.param == "merged" else
                     {"K": math.sqrt(s * s0 / D), "Q": math.sqrt(s * s0 / D), "V": math.sqrt(s0 / D),
                      "O": math.sqrt(s0 / D)})
        elif cfg.init == "uniform_full":
            scale = dict.fromkeys(("K", "Q", "V", "O", "W", "U"), cfg.init_scale / math.sqrt(cfg.token_dim))
        else:
            scale = {"K": s0 / math.sqrt(D), "Q": s0 / math.sqrt(D), "V": s0 / math.sqrt(D), "O": s0 / math.sqrt(H * D)}
        gen = torch.Generator().manual_seed(cfg.init_seed)
        for name, p in self.named_parameters():
            if cfg.init == "random_full":
                p.copy_(scale[name] * torch.randn(p.shape, generator=gen, dtype=torch.float64))
            else:
                p.copy_(scale[name] * (2.0 * torch.rand(p.shape, generator=gen, dtype=torch.float64) - 1.0))

    @torch.no_grad()
    def _init_authors_small(self) -> None:
        """The authors' small initialisation (numerics.config): K_h = Q_h = a_h c I_D,
        V_h = diag(0_d, v_h), O_h = [0 | diag(v_h)] (:func:`authors_small_factors`)."""
        cfg = self.cfg
        d, m, D = cfg.d, cfg.m, cfg.token_dim
        a, c, v = authors_small_factors(cfg)
        eye = torch.eye(D, dtype=torch.float64)
        KQ = torch.as_tensor(a * c, dtype=torch.float64)[:, None, None] * eye
        V = torch.zeros(cfg.heads, D, D, dtype=torch.float64)
        O = torch.zeros(cfg.heads, m, D, dtype=torch.float64)
        idx = torch.arange(m)
        V[:, d + idx, d + idx] = torch.as_tensor(v, dtype=torch.float64)
        O[:, idx, d + idx] = torch.as_tensor(v, dtype=torch.float64)
        for param, value in ((self.K, KQ), (self.Q, KQ), (self.V, V), (self.O, O)):
            param.copy_(value)

    @torch.no_grad()
    def _unbalance(self, a: np.ndarray, b: np.ndarray) -> None:
        """From the balanced point of D (K = sign(omega) root, Q = root, V = sqrt|mu|,
        O = sign(mu) sqrt|mu|): K_h *= sqrt|a_h|, Q_h /= sqrt|a_h|, V_h /= sqrt|b_h|,
        O_h *= sqrt|b_h|, so K_h = a_h Q_h (omega already carries sign(a_h)), O_h = |b_h| V_h^T
        on Y, and W, U (so omega, mu) are unchanged."""
        ka = torch.as_tensor(np.sqrt(np.abs(a)), dtype=self.K.dtype, device=self.K.device)[:, None, None]
        kb = torch.as_tensor(np.sqrt(np.abs(b)), dtype=self.K.dtype, device=self.K.device)[:, None, None]
        self.K.mul_(ka)
        self.Q.div_(ka)
        self.V.div_(kb)
        self.O.mul_(kb)

    @classmethod
    def from_semi_singular_values(cls, cfg: ProblemConfig, omega, mu) -> "MultiHeadAttention":
        """The model at the point of D with semi-singular values omega, mu (H x m each);
        balanced (K = Q up to signs on X, O = V^T up to signs on Y) if factored."""
        omega = _as_matrix("omega", omega, cfg)
        mu = _as_matrix("mu", mu, cfg)
        model = cls(cfg)
        model._set_semi_singular_values(omega, mu)
        return model

    @classmethod
    def from_weights(cls, cfg: ProblemConfig, **weights) -> "MultiHeadAttention":
        """The model with given weight matrices: K, Q, V, O (factored) or W, U (merged), with
        the shapes of the parametrisation; every one must be given, finite."""
        model = cls(cfg)
        expected = {name: tuple(p.shape) for name, p in model.named_parameters()}
        if set(weights) != set(expected):
            raise ValueError(f"param={cfg.param!r} needs exactly the weights {sorted(expected)}, "
                             f"got {sorted(weights)}")
        with torch.no_grad():
            for name, value in weights.items():
                t = torch.as_tensor(value)
                if tuple(t.shape) != expected[name]:
                    raise ValueError(f"{name} must have shape {expected[name]} for heads={cfg.heads}, "
                                     f"tasks={cfg.tasks}, got {tuple(t.shape)}")
                if not torch.isfinite(t).all():
                    raise ValueError(f"{name} must be finite (it contains NaN or inf)")
                getattr(model, name).copy_(t)
        return model

    # --- the model --------------------------------------------------------------------------
    def merged_gradients(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(dL/dW, dL/dU) (H, d+m, d+m) and (H, m, d+m) pulled back to the merged weights'
        velocity under gradient flow of the *trained* parameters, from their ``.grad``:
        merged, -(dW/dt, dU/dt) = (grad W, grad U); factored, by the chain rule of
        W = K^T Q / s, U = O V with dK/dt = -grad K etc.:
        -dW/dt = (grad_K^T Q + K^T grad_Q) / s,  -dU/dt = grad_O V + O grad_V.
        Minus these is the velocity of (W, U) (detached)."""
        grads = {n: p.grad for n, p in self.named_parameters()}
        with torch.no_grad():
            if self.cfg.param == "merged":
                return grads["W"].clone(), grads["U"].clone()
            K, Q, V, O = self.K, self.Q, self.V, self.O
            gW = (grads["K"].transpose(1, 2) @ Q + K.transpose(1, 2) @ grads["Q"]) / self.cfg.logit_scale
            gU = grads["O"] @ V + O @ grads["V"]
            return gW, gU

    def semi_singular_velocity(self) -> tuple[np.ndarray, np.ndarray, float]:
        """(omega_dot, mu_dot) (H, m) of the full gradient flow at this point, read out on D
        from :meth:`merged_gradients` (theory's readout omega_i = tr(Phi_i^T W Phi_i)/r_i,
        mu_i = (U_Y)_ii, linear, so it commutes with d/dt), and the velocity's off-D part
        relative to its norm."""
        gW, gU = (-g.detach().cpu().double().numpy() for g in self.merged_gradients())
        cfg = self.cfg
        om, mu = semi_singular_values(gW, gU, cfg.tasks, cfg.basis_numpy())
        return om, mu, decomposable_residual(gW, gU, cfg.tasks, cfg.basis_numpy())

    def merged_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W (H, d+m, d+m) = K^T Q / s and U (H, m, d+m) = O V (or the trained W, U)."""
        if self.cfg.param == "merged":
            return self.W, self.U
        W = torch.matmul(self.K.transpose(1, 2), self.Q) / self.cfg.logit_scale
        U = torch.matmul(self.O, self.V)
        return W, U

    def forward(self, context: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """Predictions (B, m) for context (B, L, d+m) and query (B, d+m) (any L >= 1)."""
        cfg = self.cfg
        D, d = cfg.token_dim, cfg.d
        if context.ndim != 3 or context.shape[-1] != D or context.shape[1] < 1:
            raise ValueError(f"context must have shape (B, L, d+m) = (B, L, {D}) with L >= 1, "
                             f"got {tuple(context.shape)}")
        if query.ndim != 2 or query.shape != (context.shape[0], D):
            raise ValueError(f"query must have shape (B, d+m) = ({context.shape[0]}, {D}) to match the "
                             f"context, got {tuple(query.shape)}")
        W, U = self.merged_weights()
        # a_h = W_h[:, :d] q: the y part of z_q is zero, so only the first d columns matter
        a = torch.einsum("hij,bj->bhi", W[:, :, :d], query[:, :d])            # (B, H, D)
        c = attend(a, context)                                                # (B, H, D)
        return torch.einsum("hki,bhi->bk", U, c)                              # (B, m)

    # --- readout ------------------------------------------------------------------------------
    @torch.no_grad()
    def semi_singular_values(self) -> Readout:
        """omega[h,i] = tr(Phi_i^T W_XX Phi_i)/r_i, mu[h,i] = (U_Y)_ii and the residual
        ||(W,U) - P_D(W,U)||_F / ||(W,U)||_F (0 at the zero point), on the merged weights
        (:func:`readout`)."""
        return readout(self.cfg, *self.merged_weights())

    @classmethod
    def from_parameters(cls, cfg: ProblemConfig, **tensors) -> "MultiHeadAttention":
        """The model whose parameters ARE the given tensors (K, Q, V, O or W, U, of cfg's shapes,
        dtype and device; not copied, not checked, no initialisation run): a cheap view of
        weights held elsewhere (numerics.train hands each run's weights to its hooks this
        way).  Use :meth:`from_weights` for weights from outside."""
        model = cls.__new__(cls)
        torch.nn.Module.__init__(model)
        model.cfg = cfg
        for name in (("K", "Q", "V", "O") if cfg.param == "factored" else ("W", "U")):
            setattr(model, name, torch.nn.Parameter(tensors[name]))
        return model


@torch.no_grad()
def readout(cfg: ProblemConfig, W: torch.Tensor, U: torch.Tensor) -> Readout:
    """The readout of merged weights W (H, d+m, d+m), U (H, m, d+m): omega[h,i] =
    tr(Phi_i^T W_XX Phi_i)/r_i, mu[h,i] = (U_Y)_ii and the residual ||(W,U) - P_D(W,U)||_F /
    ||(W,U)||_F (``theory.reduced_ode.semi_singular_values`` and ``decomposable_residual``,
    the one definition of both); TrainingDiverged for weights that are no longer finite."""
    W, U = (t.detach().to("cpu", torch.float64).numpy() for t in (W, U))
    if not (np.all(np.isfinite(W)) and np.all(np.isfinite(U))):
        raise TrainingDiverged("the model's weights contain NaN or inf (the run diverged); "
                               "lower the learning rate or the initial scale")
    omega, mu = semi_singular_values(W, U, cfg.tasks, cfg.basis_numpy())
    return Readout(omega=omega, mu=mu, residual=decomposable_residual(W, U, cfg.tasks, cfg.basis_numpy()))


def full_velocity_on_D(cfg: ProblemConfig, omega, mu, prompts) -> tuple[np.ndarray, np.ndarray, float]:
    """The full model's gradient-flow velocity at the point of D with values (omega, mu), on
    ``prompts``, read out on D: (omega_dot, mu_dot, off-D residual of the velocity)
    (:meth:`MultiHeadAttention.semi_singular_velocity` after one backward pass)."""
    model = MultiHeadAttention.from_semi_singular_values(cfg, omega, mu)
    mse_loss(model(prompts.context, prompts.query), prompts.target).backward()
    return model.semi_singular_velocity()


def _check_values(omega: torch.Tensor, mu: torch.Tensor, cfg: ProblemConfig) -> None:
    """omega, mu must be (H, m) tensors: mu of another shape broadcasts into a wrong prediction."""
    for name, t in (("omega", omega), ("mu", mu)):
        if not torch.is_tensor(t):
            raise TypeError(f"{name} must be a torch.Tensor of shape (heads, m), got {type(t).__name__}")
        if tuple(t.shape) != (cfg.heads, cfg.m):
            raise ValueError(f"{name} must have shape (heads, m) = ({cfg.heads}, {cfg.m}), got {tuple(t.shape)}")


def block_scores(prompts: Prompts, cfg: ProblemConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, labels), each (..., B, L, m): s_{l,j} = <Phi_j^T x_l, Phi_j^T q> and y_{l,j}
    (prompts of any leading shape: one batch, or the stacked streams of a numerics.train program)."""
    d = cfg.d
    x, y, q = prompts.context[..., :d], prompts.context[..., d:], prompts.query[..., :d]
    if cfg.basis != "identity":
        Phi = cfg.basis_matrix()
        x, q = x @ Phi, q @ Phi                     # coordinates in the task basis: Phi^T x
    scores = (x * q[..., None, :]) @ cfg.task_indicator()   # (..., B, L, m): block sums of x_lk q_k
    return scores, y


def attention_weights(omega: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """p (B, H, L): p_hl = softmax_l( sum_j omega[h,j] s_{l,j} ) for scores (B, L, m)."""
    logits = torch.matmul(omega, scores.transpose(1, 2))     # (B, H, L)
    return torch.softmax(logits, dim=-1)                     # over the context; max subtracted


def predict_from_scores(omega: torch.Tensor, mu: torch.Tensor, scores: torch.Tensor,
                        labels: torch.Tensor) -> torch.Tensor:
    """y_hat (B, m): y_hat_i = sum_h mu[h,i] sum_l p_hl y_{l,i}, p = :func:`attention_weights`."""
    c = torch.bmm(attention_weights(omega, scores), labels)  # (B, H, m): sum_l p_hl y_{l,i}
    return (mu[None] * c).sum(dim=1)


def reduced_predict(omega: torch.Tensor, mu: torch.Tensor, prompts: Prompts, cfg: ProblemConfig) -> torch.Tensor:
    """y_hat (B, m) of the reduced model with values omega, mu (H x m) on ``prompts``."""
    _check_values(omega, mu, cfg)
    return predict_from_scores(omega, mu, *block_scores(prompts, cfg))


def per_prompt_reduced_losses(omega: torch.Tensor, mu: torch.Tensor, prompts: Prompts,
                              cfg: ProblemConfig) -> torch.Tensor:
    """||y_q - y_hat||^2 of each prompt (B,) at (omega, mu)."""
    return ((reduced_predict(omega, mu, prompts, cfg) - prompts.target) ** 2).sum(dim=-1)


def reduced_loss(omega: torch.Tensor, mu: torch.Tensor, prompts: Prompts, cfg: ProblemConfig) -> torch.Tensor:
    """Monte-Carlo estimate of L_L(omega, mu) = E ||y_q - y_hat||^2 on ``prompts`` (scalar)."""
    return per_prompt_reduced_losses(omega, mu, prompts, cfg).mean()


def _leaf(t, cfg: ProblemConfig) -> torch.Tensor:
    return torch.as_tensor(t, dtype=cfg.torch_dtype, device=cfg.device).detach().clone().requires_grad_(True)


def reduced_gradient(omega, mu, prompts: Prompts, cfg: ProblemConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/domega, dL/dmu), each (H, m), of :func:`reduced_loss` on ``prompts`` (autograd)."""
    om, m_ = _leaf(omega, cfg), _leaf(mu, cfg)
    return torch.autograd.grad(reduced_loss(om, m_, prompts, cfg), [om, m_])


def per_prompt_reduced_gradients(omega, mu, prompts: Prompts, cfg: ProblemConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradient of each prompt's loss: (B, H, m) for omega and for mu (the Jacobian of
    :func:`per_prompt_reduced_losses`; their mean over prompts is :func:`reduced_gradient`)."""
    om, m_ = (torch.as_tensor(t, dtype=cfg.torch_dtype, device=cfg.device) for t in (omega, mu))
    return torch.autograd.functional.jacobian(lambda o, m: per_prompt_reduced_losses(o, m, prompts, cfg),
                                              (om, m_), vectorize=True)


def metric_factors(omega: torch.Tensor, mu: torch.Tensor, cfg: ProblemConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(f_omega, f_mu), each (H, m): d omega/dt = -f_omega dL/domega, d mu/dt = -f_mu dL/dmu,
    for cfg.param and cfg.logit_scale: ``theory.reduced_ode.metric_factors`` (the one
    definition) on these values, returned as tensors of omega's dtype and device.  The H x m
    values make a round trip through numpy (negligible next to a batch)."""
    _check_values(omega, mu, cfg)
    f_om, f_mu = stacked_metric_factors(omega[None], mu[None], cfg)
    return f_om[0], f_mu[0]


def stacked_metric_factors(omega: torch.Tensor, mu: torch.Tensor, cfg: ProblemConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`metric_factors` of R runs of cfg's param, logit scale and tasks at once, omega and mu
    (R, H, m): the factors are elementwise per head, so the R H heads go through one call (the
    same numbers as R calls, without R round trips through numpy)."""
    R, H, m = omega.shape
    f_om, f_mu = theory_metric_factors(cfg.param, omega.detach().cpu().double().numpy().reshape(R * H, m),
                                       mu.detach().cpu().double().numpy().reshape(R * H, m), cfg.tasks,
                                       cfg.logit_scale)
    opts = dict(dtype=omega.dtype, device=omega.device)
    return torch.as_tensor(f_om, **opts).view(R, H, m), torch.as_tensor(f_mu, **opts).view(R, H, m)


def symmetrize_full(prompts: Prompts, cfg: ProblemConfig, drop: int = 0) -> Prompts:
    """Every prompt under every element (T, S) of G (batch x |G| prompts, element-major).

    x and q are mapped by Phi T Phi^T (exact signed permutations when Phi = I, exact to
    rounding otherwise), y_i and the target y_{q,i} by the sign S_i.  With ``drop`` > 0 the
    last ``drop`` group elements are left out: a deliberately symmetry-breaking batch."""
    from theory.block_structure import symmetry_group   # claim 1's group: only symmetrised batches load it
    T, S = symmetry_group(cfg.tasks)
    if isinstance(drop, bool) or not isinstance(drop, (int, np.integer)) or drop < 0:
        raise ValueError(f"drop must be an integer >= 0, got {drop!r}")
    if drop:
        if drop >= len(T):
            raise ValueError(f"drop must be < |G| = {len(T)}, got {drop}")
        T, S = T[:-drop], S[:-drop]
    return _apply_elements(prompts, cfg, T, S)


SUBGROUPS = ("output_signs", "x_symmetries")


def symmetrize_subgroup(prompts: Prompts, cfg: ProblemConfig, keep: str) -> Prompts:
    """Every prompt under every element of a subgroup of G (batch x |subgroup| prompts).

    ``keep="output_signs"``: the 2^m elements with T = I (per-task output sign flips only);
    their fixed set is {W_XX unrestricted, U_Y diagonal}, larger than D when d >= 2.
    ``keep="x_symmetries"``: the elements with S = +1 (coordinate sign flips and block
    shifts of x only); their fixed set is {W_XX block-scalar, U_Y unrestricted}, larger than
    D when m >= 2.  A batch symmetric under a subgroup only: the flow from D may leave D
    in the directions that subgroup does not kill (what a wrong symmetry group predicts
    it would not)."""
    if keep not in SUBGROUPS:
        raise ValueError(f"keep must be one of {SUBGROUPS}, got {keep!r}")
    from theory.block_structure import symmetry_group   # claim 1's group: only symmetrised batches load it
    T, S = symmetry_group(cfg.tasks)
    if keep == "output_signs":
        sel = np.all(T == np.eye(cfg.d)[None], axis=(1, 2))
    else:
        sel = np.all(S == 1.0, axis=1)
    return _apply_elements(prompts, cfg, T[sel], S[sel])


def _apply_elements(prompts: Prompts, cfg: ProblemConfig, T: np.ndarray, S: np.ndarray) -> Prompts:
    """The batch under the group elements (T, S) (element-major)."""
    d = cfg.d
    Phi = cfg.basis_numpy()
    A = np.einsum("ab,gbc,dc->gad", Phi, T, Phi)            # Phi T Phi^T, (G, d, d)
    A = torch.tensor(A, dtype=prompts.context.dtype, device=prompts.context.device)
    S = torch.tensor(S, dtype=prompts.context.dtype, device=prompts.context.device)
    x, y, q = prompts.context[..., :d], prompts.context[..., d:], prompts.query[:, :d]
    xg = torch.einsum("gad,bld->gbla", A, x)                  # (G, B, L, d)
    qg = torch.einsum("gad,bd->gba", A, q)
    yg = S[:, None, None, :] * y[None]
    tg = S[:, None, :] * prompts.target[None]
    G, B = A.shape[0], x.shape[0]
    context = torch.cat([xg, yg], dim=-1).reshape(G * B, cfg.L, cfg.token_dim)
    query = torch.cat([qg, torch.zeros(G, B, cfg.m, dtype=q.dtype, device=q.device)], dim=-1)
    return Prompts(context=context, query=query.reshape(G * B, cfg.token_dim),
                   target=tg.reshape(G * B, cfg.m))
