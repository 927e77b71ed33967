"""Claim 1: block structure is preserved.

The law of one prompt is invariant under a group G acting on tokens z = (x, y) in R^{d+m}:

- block rotations: x -> (I + Phi_i (R_i - I) Phi_i^T) x with R_i in O(r_i) (and q, g_i
  rotated alike, so y is unchanged);
- per-task sign flips: y_i -> -y_i (with g_i, eps_i -> -g_i, -eps_i; x, q unchanged).

An element acts on the weights of one head by W -> T W T^T and U -> S_Y U T^T, where
T = blockdiag(T_X, S_Y) acts on tokens and S_Y = diag(+-1) on outputs (the prediction
y_hat transforms like y).  Since the population loss is G-invariant, its gradient is
G-equivariant, and a point fixed by G stays fixed along the flow.  The fixed set

    D = { W = [[sum_i omega_i Phi_i Phi_i^T, 0], [0, 0]],  U = [0 | diag(mu)] }

(plus W_XY, W_YY, which never receive gradient because z_q = (q, 0) has no y part; the
X-Y and Y-X blocks are killed by the sign flips, W_YY's off-diagonal too, and its
diagonal is in ker of the gradient) is computed symbolically by :func:`commutant`.

:func:`project_decomposable` is the Frobenius-orthogonal projection P_D used by the
numerics for the residual ||theta - P_D theta|| / ||theta||.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ._validate import check_finite_array, check_tasks


# ---------------------------------------------------------------------------------------
# the projection onto D (numpy; what the numerics use)
# ---------------------------------------------------------------------------------------

def _check_basis(basis, d: int) -> np.ndarray:
    Phi = check_finite_array("basis", basis)
    if Phi.shape != (d, d):
        raise ValueError(f"basis must be the d x d orthonormal matrix Phi with d = sum(tasks) = {d}, "
                         f"got shape {Phi.shape}")
    err = np.max(np.abs(Phi.T @ Phi - np.eye(d))) if d else 0.0
    if err > 1e-8:
        raise ValueError(f"basis must be orthonormal (Phi^T Phi = I); max |Phi^T Phi - I| = {err:.3g}. "
                         "Orthonormalise it first (e.g. numpy.linalg.qr)")
    return Phi


def _block_columns(tasks: tuple[int, ...]) -> list[slice]:
    edges = np.concatenate([[0], np.cumsum(tasks)])
    return [slice(int(a), int(b)) for a, b in zip(edges[:-1], edges[1:])]


def _check_weights(W, U, tasks):
    d, m = sum(tasks), len(tasks)
    W = check_finite_array("W", W)
    U = check_finite_array("U", U)
    if W.ndim == 2:  # one head given without the head axis
        W = W[None]
    if U.ndim == 2:
        U = U[None]
    if W.ndim != 3 or W.shape[1:] != (d + m, d + m):
        raise ValueError(f"W must have shape (H, d+m, d+m) = (H, {d + m}, {d + m}) for tasks {tasks}, "
                         f"got {W.shape}")
    if U.ndim != 3 or U.shape[1:] != (m, d + m):
        raise ValueError(f"U must have shape (H, m, d+m) = (H, {m}, {d + m}) for tasks {tasks}, got {U.shape}")
    if W.shape[0] != U.shape[0]:
        raise ValueError(f"W and U must have the same number of heads, got {W.shape[0]} and {U.shape[0]}")
    if W.shape[0] < 1:
        raise ValueError("W, U must have at least one head (H >= 1)")
    return W, U


def semi_singular_values(W, U, tasks, basis) -> tuple[np.ndarray, np.ndarray]:
    """Readout of any weights: omega[h,i] = tr(Phi_i^T W_XX Phi_i) / r_i, mu[h,i] = (U_Y)_ii.

    These are the coordinates of P_D(W, U) in D.  Arrays of shape (H, m)."""
    tasks = check_tasks(tasks)
    W, U = _check_weights(W, U, tasks)
    d = sum(tasks)
    Phi = _check_basis(basis, d)
    H, m = W.shape[0], len(tasks)
    omega = np.empty((H, m))
    for i, cols in enumerate(_block_columns(tasks)):
        P = Phi[:, cols]
        # tr(P^T W_XX P) for every head at once
        omega[:, i] = np.einsum("ai,hab,bi->h", P, W[:, :d, :d], P) / tasks[i]
    mu = np.stack([np.diag(U[h, :, d:]) for h in range(H)])
    return omega, mu


def decomposable_weights(omega, mu, tasks, basis) -> tuple[np.ndarray, np.ndarray]:
    """The point of D with semi-singular values (omega, mu): W (H, d+m, d+m), U (H, m, d+m)."""
    tasks = check_tasks(tasks)
    d, m = sum(tasks), len(tasks)
    Phi = _check_basis(basis, d)
    omega = check_finite_array("omega", omega)
    mu = check_finite_array("mu", mu)
    if omega.ndim != 2 or omega.shape[1] != m or mu.shape != omega.shape:
        raise ValueError(f"omega and mu must both have shape (H, m) with m = {m}, got {omega.shape}, {mu.shape}")
    H = omega.shape[0]
    W = np.zeros((H, d + m, d + m))
    U = np.zeros((H, m, d + m))
    for i, cols in enumerate(_block_columns(tasks)):
        P = Phi[:, cols]
        W[:, :d, :d] += omega[:, i, None, None] * (P @ P.T)[None]
    U[:, np.arange(m), d + np.arange(m)] = mu
    return W, U


def project_decomposable(W, U, tasks, basis) -> tuple[np.ndarray, np.ndarray]:
    """Frobenius-orthogonal projection P_D onto the decomposable set D, head by head.

    W (H, d+m, d+m), U (H, m, d+m), tasks = (r_1..r_m), basis = Phi (d x d, orthonormal,
    columns grouped by task).  D is the linear span of {Phi_i Phi_i^T in the X-X block of W}
    and {E_ii in the Y block of U}.  The matrices Phi_i Phi_i^T are mutually orthogonal with
    squared Frobenius norm r_i, so the projection coefficient is
        omega_i = <W_XX, Phi_i Phi_i^T>_F / r_i = tr(Phi_i^T W_XX Phi_i) / r_i,
    W_XX <- sum_i omega_i Phi_i Phi_i^T, every other block of W <- 0; U_X <- 0,
    U_Y <- diag(U_Y).  Returns new arrays (the inputs are not modified).

    A single head may be passed without the head axis (W (d+m, d+m), U (m, d+m)); the
    result then has the head axis.
    """
    tasks = check_tasks(tasks)
    omega, mu = semi_singular_values(W, U, tasks, basis)
    return decomposable_weights(omega, mu, tasks, basis)


def decomposable_residual(W, U, tasks, basis) -> float:
    """||(W, U) - P_D(W, U)||_F / ||(W, U)||_F (0 for the zero point)."""
    W_D, U_D = project_decomposable(W, U, tasks, basis)
    W = np.asarray(W, float).reshape(W_D.shape)
    U = np.asarray(U, float).reshape(U_D.shape)
    total = np.sqrt(np.sum(W ** 2) + np.sum(U ** 2))
    if total == 0.0:
        return 0.0
    return float(np.sqrt(np.sum((W - W_D) ** 2) + np.sum((U - U_D) ** 2)) / total)
