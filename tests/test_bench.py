"""The benchmark's baseline computes our model, and the benchmark runs end to end.

- ``ReferenceAttention`` (per-head q/k/v/o linear layers over every token) and
  ``MultiHeadAttention`` (projections of the query and the weighted context only) agree,
  given the same weights and prompts, in the prediction, the gradient of every weight and
  the weights after one GD step, to float64 rounding; a perturbed reference (wrong logit
  scale, one weight moved by 1e-8) is rejected at the same tolerance.
- ``python -m numerics.bench --smoke`` runs and writes valid JSON, ``--quick`` writes
  the contract's keys and ``batched_runs``; bad flags are refused
  with a message saying what is wrong.
- On ``--device cuda`` (marker ``gpu``): the same agreement on the GPU, and CPU and GPU agree
  on the same batch.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from numerics.bench import QUICK, main, parse_args, peak_memory
from numerics.config import ProblemConfig, use_precise_float32
from numerics.config import make_generator, sample_prompts
from numerics.model import MultiHeadAttention, mse_loss
from numerics.bench.reference import ReferenceAttention, gd_step, model_factors

# Tolerance: both sides compute the same sums in a different order.  Each output is a
# composition of dot products of length at most n = L + D (logits, softmax normalisation,
# weighted context, O V); the standard forward-error bound of a length-n sum is
# n * eps * sum|terms|, and the weights and tokens here are O(1), so relative errors stay
# below (L + D) * eps * (a few) ~ 50 * 2.2e-16 * 10 ~ 1e-13.  1e-11 leaves a factor 100.
RTOL = 1e-11


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    scale = max(float(a.abs().max()), float(b.abs().max()), 1e-300)
    return float((a - b).abs().max()) <= RTOL * scale


def _reference_grads(ref: ReferenceAttention) -> dict:
    """The reference's gradients stacked in the model's layout (K, Q, V: (H, D, D); O: (H, m, D))."""
    H, D = ref.cfg.heads, ref.cfg.token_dim
    Q = torch.stack([ref.q_proj[h].weight.grad for h in range(H)])
    O = ref.o_proj.weight.grad.reshape(-1, H, D).transpose(0, 1)
    if ref.merged:
        return {"W": Q, "U": O}
    K = torch.stack([ref.k_proj[h].weight.grad for h in range(H)])
    V = torch.stack([ref.v_proj[h].weight.grad for h in range(H)])
    return {"K": K, "Q": Q, "V": V, "O": O}


def _agreement(model: MultiHeadAttention, ref: ReferenceAttention, prompts) -> dict:
    """Prediction, gradients and post-step weights of both: True where they agree."""
    pm, pr = model(prompts.context, prompts.query), ref(prompts.context, prompts.query)
    mse_loss(pm, prompts.target).backward()
    mse_loss(pr, prompts.target).backward()
    grads_model = {k: v.grad for k, v in model.named_parameters()}
    out = {"prediction": _close(pm.detach(), pr.detach())}
    for k, g in _reference_grads(ref).items():
        out[f"grad {k}"] = _close(grads_model[k], g)
    model.zero_grad(), ref.zero_grad()
    gd_step(model, prompts, 0.05, mse_loss)
    gd_step(ref, prompts, 0.05, mse_loss)
    after = ReferenceAttention.from_model(model)   # the model's new weights in the reference's layout
    for (name, a), (_, b) in zip(after.named_parameters(), ref.named_parameters()):
        out[f"step {name}"] = _close(a.detach(), b.detach())
    return out


configs = st.builds(
    lambda tasks, heads, L, param, scale, init, seed: ProblemConfig(
        tasks=tuple(tasks), heads=heads, L=L, param=param, logit_scale=scale, init=init,
        init_seed=seed, init_scale=0.5),
    tasks=st.lists(st.integers(1, 3), min_size=1, max_size=3),  # L >= 2: at L = 1 softmax is constant
    heads=st.integers(1, 3), L=st.integers(2, 24), param=st.sampled_from(["factored", "merged"]),
    scale=st.sampled_from([1.0, 0.7, 3.0]), init=st.sampled_from(["random_full", "decomposable"]),
    seed=st.integers(0, 100))


@given(cfg=configs)
def test_reference_computes_our_model(cfg):
    model = MultiHeadAttention(cfg)
    ref = ReferenceAttention.from_model(model)
    prompts = sample_prompts(cfg, 16, make_generator(1, "cpu"))
    agree = _agreement(model, ref, prompts)
    assert all(agree.values()), agree

    # the same check must reject a reference that is slightly wrong
    f = model_factors(model)
    if cfg.param == "factored":
        wrong_scale = ReferenceAttention(cfg.replace(logit_scale=cfg.logit_scale * (1 + 1e-6)))
        wrong_scale.load_factors(**f)
        assert not _agreement(MultiHeadAttention(cfg), wrong_scale, prompts)["prediction"]
    moved = {k: v.clone() for k, v in f.items()}
    key = "Q" if cfg.param == "factored" else "W"
    moved[key][0, 0, 0] += 1e-8 * max(1.0, float(moved[key].abs().max()))
    perturbed = ReferenceAttention(cfg).load_factors(**moved)
    agree = _agreement(MultiHeadAttention(cfg), perturbed, prompts)
    assert not all(agree.values()), "a weight moved by 1e-8 went unnoticed: the check cannot discriminate"


def test_bench_smoke_writes_valid_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    res = main(["--smoke", "--dtype", "float32", "--no-progress", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "1. milliseconds per gradient step" in printed and "4. 8 runs of 3 steps" in printed
    assert "3. peak memory one step adds" in printed
    data = json.loads(out.read_text())
    assert set(data) >= {"meta", "step", "reduced_vs_full", "peak_memory", "batched"}
    step = data["step"]["float32"]
    for key in ("trainer_seconds", "reference_seconds", "sampling_seconds", "model_only_seconds"):
        t = step[key]
        assert 0 < t["min"] <= t["median"] <= t["max"] and math.isfinite(t["max"])
    assert step["ratio_reference_over_trainer"]["median"] == pytest.approx(
        step["reference_seconds"]["median"] / step["trainer_seconds"]["median"])
    assert data["peak_memory"]["float32"]["ours_quick"]["bytes"] >= 0
    assert data["meta"]["precision"]["float32_matmul_precision"] == "highest"
    assert res["meta"]["smoke"] is True and res["meta"]["profile"] == "full"
    # section 4 at both sizes (the authors' configuration only in the full profile)
    assert set(data["batched"]) >= {"quick", "authors", "runs", "steps", "dtype"}
    for size in ("quick", "authors"):
        _check_batched(data["batched"][size], data["batched"]["runs"])


def _check_batched(section: dict, runs: int) -> None:
    """Section 4's numbers are what they say: runs per second = runs / median seconds, ratio =
    one after another / batched, every run set split into programs holding all its runs."""
    seq = section["sequential_seconds"]["median"]
    assert section["sequential_per_s"] == pytest.approx(runs / seq)
    for kind in ("mixed", "one_stream", "own_streams"):
        k = section[kind]
        assert k["batched_per_s"] == pytest.approx(runs / k["seconds"]["median"])
        assert k["ratio"] == pytest.approx(seq / k["seconds"]["median"])
        assert sum(k["programs"]) == runs and all(isinstance(p, int) and p >= 1 for p in k["programs"])
    assert section["one_stream"]["programs"] == [runs]          # one stream: always one program


def test_bench_quick_contract_keys_and_types(tmp_path):
    """The contract: ``--quick --out FILE`` writes the top-level keys ratio_full_step,
    ratio_model_step (each {"float32": x, "float64": y}), sampling_ms, model_ms (per dtype),
    threads and the precision settings; --quick runs sections 1, 2 and 4 only. Tiny sizes
    (--smoke): the keys and types are checked, not the numbers."""
    out = tmp_path / "bench.json"
    main(["--quick", "--smoke", "--threads", "1", "--no-progress", "--out", str(out)])
    data = json.loads(out.read_text())
    for key in ("ratio_full_step", "ratio_model_step", "sampling_ms", "model_ms", "ratio_reduced_flow",
                "ratio_expansion_flow"):
        assert set(data[key]) == {"float32", "float64"}, key
        assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in data[key].values()), key
    step = data["step"]
    for dt in ("float32", "float64"):   # the contract is read off the sections, not measured apart
        assert data["ratio_full_step"][dt] == step[dt]["ratio_reference_over_trainer"]["median"]
        assert data["ratio_model_step"][dt] == step[dt]["ratio_model_only"]["median"]
        assert data["sampling_ms"][dt] == pytest.approx(1e3 * step[dt]["sampling_seconds"]["median"])
        red = data["reduced_vs_full"][dt]
        assert data["ratio_reduced_flow"][dt] == red["speedup"]["median"]
        assert data["ratio_expansion_flow"][dt] == red["expansion_speedup"]
        # the full flow to the expansion time: its measured fixed cost plus T / lr trainer steps
        steps, exp_steps = data["reduced_vs_full"]["steps"], data["reduced_vs_full"]["expansion_steps"]
        tr = step[dt]["trainer_seconds"]["median"]
        fixed = max(0.0, red["full_seconds"]["median"] - steps * tr)
        assert red["full_seconds_to_expansion_time"] == pytest.approx(fixed + exp_steps * tr)
    assert data["reduced_vs_full"]["estimator"] == "marginal"
    assert data["reduced_vs_full"]["expansion"]["status"] == ["t_end"]
    assert data["threads"] == 1 and isinstance(data["threads"], int)
    assert data["precision"]["float32_matmul_precision"] == "highest"
    # TF32 off, in whichever API this torch has (numerics.config.use_precise_float32)
    assert data["precision"].get("cuda.matmul.fp32_precision", "ieee") == "ieee"
    assert data["precision"].get("cuda.matmul.allow_tf32", False) is False
    assert data["profile"] == "quick" and data["targets"]["ratio_full_step"] == {"float32": 10.0, "float64": 15.0}
    assert all(isinstance(v, bool) for per in data["targets_met"].values() for v in per.values())
    assert "peak_memory" not in data
    # the contract's batched_runs at the quick size, read off section 7's mixed run set
    br = data["batched_runs"]
    assert {"runs", "batched_per_s", "sequential_per_s", "ratio"} <= set(br)
    assert isinstance(br["runs"], int) and br["runs"] == data["batched"]["runs"] == 8
    assert all(isinstance(br[k], float) and math.isfinite(br[k]) and br[k] > 0
               for k in ("batched_per_s", "sequential_per_s", "ratio"))
    assert br["ratio"] == data["batched"]["quick"]["mixed"]["ratio"]
    assert br["ratio"] == pytest.approx(br["batched_per_s"] / br["sequential_per_s"])
    _check_batched(data["batched"]["quick"], 8)
    assert "authors" not in data["batched"]                     # --quick: the quick size only


@pytest.mark.thorough
def test_peak_memory_in_a_fresh_process_sees_the_context():
    """One step at batch 4096, L = 256, D = 15 in float64 holds at least its context tensor,
    4096 * 256 * 15 * 8 bytes = 126 MB, in pages a fresh process has never touched (the
    warm-up step at batch 2 allocates far less), so the measured peak cannot be lower."""
    res = peak_memory(QUICK, "float64", "cpu", "ours")
    assert res["bytes"] >= 4096 * 256 * 15 * 8, res


@pytest.mark.parametrize("argv, message", [
    (["--dtype", "float16"], "unknown dtype"),
    (["--device", "tpu"], "unknown device"),
    (["--repeats", "0"], "positive integer"),
    (["--reduced-time", "nan"], "finite number"),
    (["--expansion-time", "0"], "finite number"),
])
def test_bench_refuses_bad_flags(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert message in capsys.readouterr().err


def test_bench_help_runs_as_a_module():
    """``python -m numerics.bench --help`` runs (the package imports as a module entry point)."""
    shown = subprocess.run([sys.executable, "-m", "numerics.bench", "--help"], capture_output=True, text=True,
                           timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert shown.returncode == 0 and "--reduced-time" in shown.stdout


@pytest.mark.gpu
def test_gpu_agrees_with_reference_and_cpu(device):
    if not device.startswith("cuda"):
        pytest.skip("GPU case: run with --device cuda")
    use_precise_float32()
    for param in ("factored", "merged"):
        cfg = ProblemConfig(tasks=(3, 2), heads=2, L=64, param=param, init="random_full", init_scale=0.5)
        cpu_model = MultiHeadAttention(cfg)
        prompts = sample_prompts(cfg, 256, make_generator(0, "cpu"))
        gpu_cfg = cfg.replace(device=device)
        gpu_model = MultiHeadAttention(gpu_cfg)
        gpu_model.load_state_dict(cpu_model.state_dict())
        gpu_prompts = type(prompts)(*(t.to(device) for t in (prompts.context, prompts.query, prompts.target)))
        # the GPU model against its standard-way reference, on the GPU
        agree = _agreement(gpu_model, ReferenceAttention.from_model(gpu_model), gpu_prompts)
        assert all(agree.values()), agree
        # CPU and GPU: the same weights after one step on the same batch
        gpu_model = MultiHeadAttention(gpu_cfg)
        gpu_model.load_state_dict(cpu_model.state_dict())
        gd_step(cpu_model, prompts, 0.05, mse_loss)
        gd_step(gpu_model, gpu_prompts, 0.05, mse_loss)
        for (k, a), (_, b) in zip(cpu_model.named_parameters(), gpu_model.named_parameters()):
            assert _close(a.detach(), b.detach().cpu()), k


@pytest.mark.gpu
def test_gpu_bench_quick(device, tmp_path):
    if not device.startswith("cuda"):
        pytest.skip("GPU case: run with --device cuda")
    out = tmp_path / "bench.json"
    main(["--quick", "--device", device, "--no-progress", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["meta"]["gpu"] and np.isfinite(data["step"]["float64"]["trainer_seconds"]["median"])
