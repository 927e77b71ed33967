"""This machine's limits (measured memory bandwidth and matmul throughput) and the cost
model of our step (bytes it must move, FLOPs it must do): together the roofline."""
from __future__ import annotations

import torch

from numerics.config import ProblemConfig
from numerics.bench.timing import time_repeated


def memory_bandwidth(device: str, nbytes: int = 256 * 2**20, repeats: int = 7, warmup: int = 2) -> dict:
    """Measured memory bandwidth in bytes/s: ``dst.copy_(src)`` of ``nbytes`` (reads
    nbytes, writes nbytes: 2 * nbytes moved) and ``torch.add(a, b, out=c)`` (3 * nbytes).
    Sized far beyond any cache, so this is DRAM (or HBM) bandwidth."""
    n = nbytes // 4
    src = torch.rand(n, device=device)
    dst = torch.empty_like(src)
    other = torch.rand(n, device=device)
    copy = time_repeated(lambda: dst.copy_(src), repeats, warmup, device)
    add = time_repeated(lambda: torch.add(src, other, out=dst), repeats, warmup, device)
    return {
        "bytes": nbytes,
        "copy_bytes_per_s": _rate(2 * nbytes, copy),
        "add_bytes_per_s": _rate(3 * nbytes, add),
    }


def matmul_throughput(device: str, dtype: torch.dtype, n: int, repeats: int = 5, warmup: int = 2) -> dict:
    """Measured dense matmul throughput in FLOP/s: an n x n by n x n product is 2 n^3 FLOPs."""
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, dtype=dtype, device=device, generator=g)
    b = torch.randn(n, n, dtype=dtype, device=device, generator=g)
    out = torch.empty_like(a)
    t = time_repeated(lambda: torch.matmul(a, b, out=out), repeats, warmup, device)
    return {"n": n, "flop_per_s": _rate(2 * n**3, t)}


def _rate(amount: float, timing: dict) -> dict:
    """amount / seconds as median, min (slowest run) and max (fastest run)."""
    return {"median": amount / timing["median"], "min": amount / timing["max"],
            "max": amount / timing["min"]}


def item_bytes(cfg: ProblemConfig) -> int:
    return torch.tensor([], dtype=cfg.torch_dtype).element_size()


def bytes_moved(cfg: ProblemConfig, batch: int) -> dict:
    """Bytes one step of our model must move (no fusion across operations assumed).

    With E = B L D elements in the context tensor (D = d + m) and G = B L H in each
    logit-sized tensor, one step touches

        sampling:  write the context once                                   E
        forward:   logits = a Z^T (read Z, write G), softmax (read G, write G),
                   c = p Z (read Z, read G)                                 2E + 4G
        backward:  dp = dc Z^T (read Z, write G), dlogits = p (dp - <p, dp>)
                   (read 2G, write G), da = dlogits Z (read Z, read G)      2E + 5G
        total:     5 E + 9 G elements, times the item size.

    The parameters (O(H D^2) elements) and the intermediate x, y of the sampler before
    they are copied into the context are left out, so this is a lower bound for an
    unfused step (a fully fused kernel could get by with 3 E: one write, one read forward,
    one read backward)."""
    D, H, L = cfg.token_dim, cfg.heads, cfg.L
    E, G = batch * L * D, batch * L * H
    item = item_bytes(cfg)
    return {"formula": "itemsize * (5*B*L*D + 9*B*L*H)", "context_elements": E,
            "sampling_bytes": item * E, "model_bytes": item * (4 * E + 9 * G),
            "bytes": item * (5 * E + 9 * G)}


def flops(cfg: ProblemConfig, batch: int) -> dict:
    """FLOPs of one step of our model: 2 B L D H for each of the four context products
    (logits, c, dp, da: 8 B L D H), about 9 B L H for softmax forward and backward, and
    2 B L d for the labels y = <g_i, x_i> of the sampler; the parameter gradients
    (O(B D^2 H)) are negligible.  The B L (d + m) Gaussian draws are not counted."""
    D, H, L, d = cfg.token_dim, cfg.heads, cfg.L, cfg.d
    model = 8 * batch * L * D * H + 9 * batch * L * H
    return {"formula": "8*B*L*D*H + 9*B*L*H + 2*B*L*d", "sampling_flops": 2 * batch * L * d,
            "model_flops": model, "flops": model + 2 * batch * L * d}


def roofline(moved: dict, fl: dict, bandwidth: float, flop_rate: float,
             step_seconds: float, model_seconds: float, working_set_bandwidth: float) -> dict:
    """Fractions of the machine's limits reached: (bytes / bandwidth) / time and
    (FLOPs / matmul throughput) / time, for the whole step (sampling included) and for
    forward + backward + update alone.  ``bandwidth`` is the large-array (DRAM/HBM) copy
    rate; ``working_set_bandwidth`` the copy rate of an array the size of the context
    tensor, which a large last-level cache may hold (then it, not DRAM, is the ceiling)."""
    return {
        "working_set_bytes_per_s": working_set_bandwidth,
        "fraction_of_working_set_bound": moved["bytes"] / working_set_bandwidth / step_seconds,
        "model_fraction_of_working_set_bound": moved["model_bytes"] / working_set_bandwidth / model_seconds,
        "bytes": moved, "flops": fl, "step_seconds": step_seconds, "model_seconds": model_seconds,
        "memory_time_seconds": moved["bytes"] / bandwidth,
        "fraction_of_memory_bound": moved["bytes"] / bandwidth / step_seconds,
        "compute_time_seconds": fl["flops"] / flop_rate,
        "fraction_of_matmul_peak": fl["flops"] / flop_rate / step_seconds,
        "model_fraction_of_memory_bound": moved["model_bytes"] / bandwidth / model_seconds,
        "model_fraction_of_matmul_peak": fl["model_flops"] / flop_rate / model_seconds,
        "achieved_bytes_per_s": moved["bytes"] / step_seconds,
        "achieved_flop_per_s": fl["flops"] / step_seconds,
    }
