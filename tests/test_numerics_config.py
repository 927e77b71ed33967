"""ProblemConfig: validation with clear messages, derived quantities, the basis, round trips."""
import json

import pytest
import torch

from numerics.config import ProblemConfig


def test_defaults_and_derived_quantities():
    cfg = ProblemConfig(tasks=(3, 2, 4), heads=2, L=16)
    assert (cfg.d, cfg.m, cfg.token_dim) == (9, 3, 12)
    assert cfg.torch_dtype == torch.float64 and cfg.device == "cpu"
    assert [(s.start, s.stop) for s in cfg.block_slices] == [(0, 3), (3, 5), (5, 9)]
    E = cfg.task_indicator()
    assert E.shape == (9, 3) and torch.equal(E.sum(0), torch.tensor([3.0, 2.0, 4.0], dtype=torch.float64))
    assert torch.equal(cfg.basis_matrix(), torch.eye(9, dtype=torch.float64))
    # list input is normalised to a tuple (the dataclass is frozen and hashable)
    assert ProblemConfig(tasks=[3, 3], heads=1, L=4).tasks == (3, 3)
    hash(cfg)


def test_random_basis_is_orthonormal_seeded_and_not_identity():
    cfg = ProblemConfig(tasks=(2, 3), heads=1, L=4, basis="random", basis_seed=7)
    Phi = cfg.basis_matrix()
    assert torch.allclose(Phi.T @ Phi, torch.eye(5, dtype=torch.float64), atol=1e-13)
    assert torch.equal(Phi, ProblemConfig(tasks=(2, 3), heads=1, L=4, basis="random", basis_seed=7).basis_matrix())
    assert not torch.allclose(Phi, ProblemConfig(tasks=(2, 3), heads=1, L=4, basis="random",
                                                 basis_seed=8).basis_matrix())
    assert (Phi - torch.eye(5, dtype=torch.float64)).abs().max() > 0.1
    assert ProblemConfig(tasks=(2, 3), heads=1, L=4, basis="random", dtype="float32").basis_matrix().dtype == torch.float32


def test_to_dict_from_dict_round_trip_through_json():
    cfg = ProblemConfig(tasks=(2, 1), heads=2, L=8, sigma=0.3, basis="random", param="merged",
                        init="given", init_omega=((0.1, -0.2), (0.3, 0.4)), init_mu=((1, 2), (3, 4)))
    back = ProblemConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg
    assert cfg.replace(L=32).L == 32 and cfg.replace(L=32).init_omega == cfg.init_omega
    with pytest.raises(ValueError, match="unknown ProblemConfig field"):
        ProblemConfig.from_dict({**cfg.to_dict(), "bogus": 1})


BAD = [
    (dict(heads=0), "heads must be a positive integer, got 0"),
    (dict(heads=1.5), "heads must be a positive integer"),
    (dict(heads=True), "heads must be a positive integer"),
    (dict(L=0), "L must be a positive integer, got 0"),
    (dict(L=-3), "L must be a positive integer, got -3"),
    (dict(tasks=()), "tasks must contain at least one block size"),
    (dict(tasks=(3, 0)), "every block size r_i must be >= 1"),
    (dict(tasks=(3, 2.5)), "tasks must contain positive integers"),
    (dict(tasks="3,2"), "tasks must be a sequence of positive integers"),
    (dict(sigma=float("nan")), "sigma .* finite and >= 0, got nan"),
    (dict(sigma=-0.1), "sigma .* >= 0"),
    (dict(sigma=float("inf")), "sigma .* finite"),
    (dict(basis="haar"), "basis must be one of"),
    (dict(param="linear"), "param must be one of"),
    (dict(logit_scale=0.0), "logit_scale s must be a finite number > 0"),
    (dict(logit_scale=float("nan")), "logit_scale"),
    (dict(init="xavier"), "init must be one of"),
    (dict(init_scale=-1.0), "init_scale must be a finite number > 0"),
    (dict(init_scale=float("nan")), "init_scale"),
    (dict(init_seed=-1), r"init_seed must be an integer in 0 .. 2\^64 - 1"),
    (dict(basis_seed=2 ** 64), r"basis_seed must be an integer in 0 .. 2\^64 - 1"),
    (dict(init="given"), "init='given' needs both init_omega and init_mu"),
    (dict(init="given", init_omega=((1, 2, 3),), init_mu=((1, 2),)), r"init_omega must have shape \(heads, m\) = \(1, 2\)"),
    (dict(init="given", init_omega=((1, float("nan")),), init_mu=((1, 2),)), "init_omega must be finite"),
    (dict(init_omega=((1, 2),)), "only used with init='given'"),
    (dict(dtype="float16"), "dtype must be one of"),
    (dict(device="tpu"), "unknown device 'tpu': allowed are 'cpu', 'cuda' and 'cuda:N'"),
    (dict(device="mps"), "device 'mps' is not supported"),
    (dict(device="banana"), "unknown device"),
    (dict(device=3), "device must be a string"),
]


@pytest.mark.parametrize("change,message", BAD)
def test_bad_values_are_rejected_with_a_clear_message(change, message):
    base = dict(tasks=(3, 2), heads=1, L=8)
    with pytest.raises((ValueError, TypeError), match=message):
        ProblemConfig(**{**base, **change})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised when CUDA is absent")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(ValueError, match="no CUDA device is available.*use device='cpu'"):
        ProblemConfig(tasks=(2,), heads=1, L=4, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_index_out_of_range_says_so():
    with pytest.raises(ValueError, match="does not exist"):
        ProblemConfig(tasks=(2,), heads=1, L=4, device=f"cuda:{torch.cuda.device_count()}")
