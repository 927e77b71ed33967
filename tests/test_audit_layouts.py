"""Checkpoints handed over by anyone (numerics.external): every layout read back to the weights it
was written from, the authors' layout held against a forward pass written their way, a project run
audited from its own checkpoint, and hostile files refused before anything runs (issue 27)."""
from __future__ import annotations

import json
import math
import os
import pickle

import numpy as np
import pytest
import torch
from torch import nn

from numerics import external as ex
from numerics.config import ProblemConfig
from numerics.config import make_generator, sample_prompts
from numerics.evaluate import held_out_loss
from numerics.model import MultiHeadAttention
from numerics.train import TrainConfig, train

TASKS = (2, 3)
D = sum(TASKS) + len(TASKS)
OMEGA = np.array([[0.41, 0.03], [-0.02, 0.37]])
MU = np.array([[1.9, 0.05], [-0.1, 2.2]])


def project_model(omega=OMEGA, mu=MU, param="factored", s=math.sqrt(D), basis="identity"):
    cfg = ProblemConfig(tasks=TASKS, heads=2, L=16, param=param, logit_scale=s if param == "factored" else 1.0,
                        basis=basis)
    return MultiHeadAttention.from_semi_singular_values(cfg, omega, mu)


def arrays(model, dtype=torch.float64) -> dict:
    return {k: p.detach().to(dtype) for k, p in model.named_parameters()}


def authors_state_dict(model, dtype=torch.float64) -> dict:
    """The authors' layout from a factored model: q_proj rows h D..(h+1) D are Q_h, likewise K, V;
    o_proj columns h D..(h+1) D are O_h (written by the test from the shapes, docs/audit.md)."""
    K, Q, V, O = (model.K.detach().to(dtype), model.Q.detach().to(dtype), model.V.detach().to(dtype),
                  model.O.detach().to(dtype))
    return {"q_proj.weight": torch.cat(list(Q), 0), "k_proj.weight": torch.cat(list(K), 0),
            "v_proj.weight": torch.cat(list(V), 0), "o_proj.weight": torch.cat(list(O), 1)}


def write(tmp_path, name: str, kind: str, payload) -> str:
    path = str(tmp_path / name)
    if kind == "torch":
        torch.save(payload, path)
    elif kind == "npz":
        with open(path, "wb") as fh:          # a file object: numpy adds no .npz to the name
            np.savez(fh, **{k: (v.numpy() if torch.is_tensor(v) else np.asarray(v)) for k, v in payload.items()})
    elif kind == "safetensors":
        from safetensors.torch import save_file
        tensors = {k: v.contiguous() for k, v in payload.items() if torch.is_tensor(v)}
        meta = {k: str(v) for k, v in payload.items() if not torch.is_tensor(v)}
        save_file(tensors, path, metadata=meta or None)
    return path


def readout(path, cfg_tasks=TASKS, **kw):
    e = ex.read_checkpoint(path, **kw)
    model = ex.build_model(e, ex.problem_config(e, cfg_tasks, 16))
    return e, model.semi_singular_values()


# --------------------------------------------------------------------------- every layout

def layouts(tmp_path, model, merged):
    s = model.cfg.logit_scale
    W, U = (x.detach() for x in merged.merged_weights())
    return [
        ("authors", write(tmp_path, "sd.pt", "torch", authors_state_dict(model))),
        ("authors", write(tmp_path, "wrapped.pt", "torch", {"model": {f"attention.{k}": v for k, v in
                                                                      authors_state_dict(model).items()},
                                                            "step": 120})),
        ("factored", write(tmp_path, "f.npz", "npz", {**arrays(model), "logit_scale": np.array(s)})),
        ("factored", write(tmp_path, "f.safetensors", "safetensors", {**arrays(model), "logit_scale": s, "time": 3.5})),
        ("merged", write(tmp_path, "m.npz", "npz", {"W": W, "U": U})),
        ("merged", write(tmp_path, "m.safetensors", "safetensors", {"W": W.contiguous(), "U": U.contiguous()})),
    ]


def test_every_layout_recovers_the_readout_and_a_perturbed_one_reads_perturbed(tmp_path):
    model, merged = project_model(), project_model(param="merged")
    bumped = OMEGA.copy()
    bumped[1, 0] += 0.01
    (tmp_path / "p").mkdir()
    pert, pert_merged = project_model(bumped), project_model(bumped, param="merged")
    for (layout, path), (_, ppath) in zip(layouts(tmp_path, model, merged), layouts(tmp_path / "p", pert, pert_merged)):
        e, ro = readout(path)
        assert e.layout == layout and e.picked.startswith("auto: "), (path, e.picked)
        assert np.abs(ro.omega - OMEGA).max() < 1e-12 and np.abs(ro.mu - MU).max() < 1e-12, path
        assert ro.residual < 1e-12
        _, rp = readout(ppath)
        assert abs(rp.omega[1, 0] - OMEGA[1, 0] - 0.01) < 1e-12, ppath
        assert np.abs(np.delete(rp.omega.ravel(), 2) - np.delete(OMEGA.ravel(), 2)).max() < 1e-12
    e = ex.read_checkpoint(tmp_path / "f.safetensors")
    assert e.time == 3.5 and e.logit_scale == pytest.approx(model.cfg.logit_scale)
    assert ex.read_checkpoint(tmp_path / "wrapped.pt").step == 120


def test_float32_checkpoints_read_to_float32_rounding(tmp_path):
    model = project_model()
    path = write(tmp_path, "sd32.pt", "torch", authors_state_dict(model, torch.float32))
    e, ro = readout(path)
    assert e.stored_dtype == "float32"
    eps32 = float(np.finfo(np.float32).eps)
    # the readout is a sum of D products of entries each rounded to float32
    assert np.abs(ro.omega - OMEGA).max() < 8 * D * eps32 * np.abs(OMEGA).max()
    assert np.abs(ro.mu - MU).max() < 8 * D * eps32 * np.abs(MU).max()


def test_a_random_basis_reads_back_in_that_basis(tmp_path):
    model = project_model(basis="random")
    path = write(tmp_path, "f.npz", "npz", {**arrays(model), "logit_scale": np.array(model.cfg.logit_scale)})
    e = ex.read_checkpoint(path)
    ro = ex.build_model(e, ex.problem_config(e, TASKS, 16, basis="random")).semi_singular_values()
    assert np.abs(ro.omega - OMEGA).max() < 1e-12
    wrong = ex.build_model(e, ex.problem_config(e, TASKS, 16)).semi_singular_values()
    assert np.abs(wrong.omega - OMEGA).max() > 1e-3          # the identity basis reads another point


def test_head_width_other_than_the_token_width_maps_onto_the_merged_model(tmp_path):
    rng = np.random.default_rng(0)
    K, Q, V = (rng.standard_normal((2, 4, D)) for _ in range(3))
    O = rng.standard_normal((2, len(TASKS), 4))
    e = ex.read_checkpoint(write(tmp_path, "k4.npz", "npz", {"K": K, "Q": Q, "V": V, "O": O, "logit_scale": 2.0}))
    assert e.param == "merged"
    W = np.einsum("hka,hkb->hab", K, Q) / 2.0
    assert np.allclose(e.weights["W"], W) and np.allclose(e.weights["U"], O @ V)


# --------------------------------------------------------------------------- the authors' layout

class AuthorsStyleAttention(nn.Module):
    """Multi-head attention written the authors' way, independently of numerics.model: one
    nn.Linear each for q, k, v of width H (d+m), no bias, per-head scores q_h . k_h / sqrt(d+m) of
    the query token against the L context tokens, the heads' outputs concatenated into o_proj."""

    def __init__(self, H: int, D: int, m: int):
        super().__init__()
        self.H, self.D = H, D
        self.q_proj = nn.Linear(D, H * D, bias=False, dtype=torch.float64)
        self.k_proj = nn.Linear(D, H * D, bias=False, dtype=torch.float64)
        self.v_proj = nn.Linear(D, H * D, bias=False, dtype=torch.float64)
        self.o_proj = nn.Linear(H * D, m, bias=False, dtype=torch.float64)

    def forward(self, context, query):
        B, L, D = context.shape
        q = self.q_proj(query).view(B, self.H, D)
        k = self.k_proj(context).view(B, L, self.H, D)
        v = self.v_proj(context).view(B, L, self.H, D)
        p = torch.softmax(torch.einsum("bhd,blhd->bhl", q, k) / math.sqrt(D), dim=-1)
        return self.o_proj(torch.einsum("bhl,blhd->bhd", p, v).reshape(B, self.H * D))


def test_authors_mapping_is_the_authors_forward_pass(tmp_path):
    torch.manual_seed(0)
    ref = AuthorsStyleAttention(3, D, len(TASKS))      # nn.Linear's default initialisation, off D
    path = write(tmp_path, "authors.pt", "torch", ref.state_dict())
    e = ex.read_checkpoint(path)
    assert (e.layout, e.heads, e.logit_scale) == ("authors", 3, pytest.approx(math.sqrt(D)))
    ours = ex.build_model(e, ex.problem_config(e, TASKS, 16))
    cfg = ProblemConfig(tasks=TASKS, heads=3, L=16)
    pr = sample_prompts(cfg, 64, make_generator(3, "cpu"))
    with torch.no_grad():
        a, b = ref(pr.context, pr.query), ours(pr.context, pr.query)
    assert float((a - b).abs().max()) < 1e-12 * float(a.abs().max())


def test_an_authors_state_dict_of_a_project_model_gives_identical_numbers(tmp_path):
    cfg = ProblemConfig(tasks=TASKS, heads=2, L=16, logit_scale=math.sqrt(D), init="uniform_full", init_scale=1.0)
    model = MultiHeadAttention(cfg)
    a = ex.read_checkpoint(write(tmp_path, "a.pt", "torch", authors_state_dict(model)))
    f = ex.read_checkpoint(write(tmp_path, "f.npz", "npz", {**arrays(model), "logit_scale": np.array(math.sqrt(D))}))
    ma, mf = (ex.measure(e, ex.problem_config(e, TASKS, 16), n=1024, seed=5) for e in (a, f))
    assert np.array_equal(ma.omega, mf.omega) and np.array_equal(ma.mu, mf.mu) and ma.residual == mf.residual
    assert (ma.loss.mean, ma.loss.se) == (mf.loss.mean, mf.loss.se)
    assert ma.split == mf.split and ma.spread == mf.spread


# --------------------------------------------------------------------------- a project run

@pytest.fixture
def one_thread():
    """One torch thread (numerics.experiments' policy: two intra-op threads on a shared 2-core machine
    stall each other about tenfold on these small batches)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_numerics_train_run_audited_from_its_checkpoint(tmp_path, one_thread):
    cfg = ProblemConfig(tasks=(1, 1), heads=2, L=16)
    ckpt = tmp_path / "run.ckpt"
    tcfg = TrainConfig(lr=0.05, time=40.0, batch=128, seed=1, records=9, checkpoint=str(ckpt), checkpoint_every=400)
    res = train(cfg, tcfg)
    e = ex.read_checkpoint(ckpt)
    assert (e.layout, e.param, e.step, e.time) == ("project", "factored", res.steps, pytest.approx(40.0))
    assert len(e.records) == len(res.trajectory) - 1           # the records up to the checkpoint's step
    meas = ex.measure(e, ex.problem_config(e, (1, 1), 16), n=8192, seed=1)
    ro = res.final_model.semi_singular_values()
    assert np.array_equal(meas.omega, ro.omega) and np.array_equal(meas.mu, ro.mu)
    own = held_out_loss(res.final_model, n=8192, seed=1)
    assert (meas.loss.mean, meas.loss.se) == (own.mean, own.se)
    # the run's own loss (mean batch loss of its last 10% of steps, a plateau here) within the standard errors
    from numerics.evaluate import loss_standard_error
    tail = res.losses[-max(1, res.steps // 10):]
    assert abs(meas.loss.mean - res.loss) <= 4 * math.hypot(meas.loss.se, loss_standard_error(tail))
    # its run.json: the readout only, and it says what is missing
    (tmp_path / "run.json").write_text(json.dumps(res.to_dict()))
    j = ex.read_checkpoint(tmp_path / "run.json")
    assert j.param == "readout" and not j.has_weights and "weights" in j.missing[0]
    assert np.allclose(j.readout["omega"], ro.omega) and j.time == pytest.approx(40.0)


# --------------------------------------------------------------------------- hostile and wrong files

class Payload:
    """Unpickling this would run a command that creates a file."""

    def __init__(self, target):
        self.target = target

    def __reduce__(self):
        return (os.system, (f"touch {self.target}",))


@pytest.mark.parametrize("how", ["pickle", "torch.save"])
def test_a_pickled_payload_is_refused_and_never_runs(tmp_path, how):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    if how == "pickle":
        path.write_bytes(pickle.dumps({"q_proj.weight": Payload(marker)}))
    else:
        torch.save({"q_proj.weight": Payload(marker)}, str(path))
    with pytest.raises(ex.CheckpointError, match="refused") as info:
        ex.read_checkpoint(path)
    assert "\n" not in str(info.value)
    assert not marker.exists()


def _bad_files(tmp_path):
    model = project_model()
    good = {**arrays(model), "logit_scale": np.array(model.cfg.logit_scale)}
    sd = authors_state_dict(model)
    out = {}
    for name, kind, payload in (("g.pt", "torch", sd), ("g.npz", "npz", good), ("g.safetensors", "safetensors",
                                                                                  {**arrays(model), "logit_scale": 2.0})):
        data = open(write(tmp_path, name, kind, payload), "rb").read()
        (tmp_path / f"trunc-{name}").write_bytes(data[: len(data) // 2])
        out[f"truncated {kind}"] = (tmp_path / f"trunc-{name}", "truncated or corrupt")
    (tmp_path / "t.json").write_text('{"config": {"tasks": [2, 3]')
    out["truncated json"] = (tmp_path / "t.json", "truncated or corrupt")
    (tmp_path / "empty.pt").write_bytes(b"")
    out["empty"] = (tmp_path / "empty.pt", "empty file")
    nan = {**good, "Q": good["Q"].clone()}
    nan["Q"][0, 0, 0] = float("nan")
    out["NaN"] = (write(tmp_path, "nan.npz", "npz", nan), "NaN or infinite")
    inf = dict(sd, **{"o_proj.weight": sd["o_proj.weight"].clone()})
    inf["o_proj.weight"][0, 0] = float("inf")
    out["inf"] = (write(tmp_path, "inf.pt", "torch", inf), "NaN or infinite")
    rows = dict(sd, **{"q_proj.weight": sd["q_proj.weight"][:-1], "k_proj.weight": sd["k_proj.weight"][:-1],
                       "v_proj.weight": sd["v_proj.weight"][:-1]})
    out["rows not H x width"] = (write(tmp_path, "rows.pt", "torch", rows), "must be H x its columns")
    out["o_proj mismatch"] = (write(tmp_path, "o.pt", "torch", dict(sd, **{"o_proj.weight": sd["o_proj.weight"][:, :-1]})),
                              "o_proj.weight has shape")
    out["K, Q mismatch"] = (write(tmp_path, "kq.npz", "npz", {**good, "K": good["K"][:, :-1]}), "K, Q must be")
    out["no logit scale"] = (write(tmp_path, "ns.npz", "npz", arrays(model)), "needs logit_scale")
    out["integer weights"] = (write(tmp_path, "int.npz", "npz", {**good, "O": np.ones((2, 2, D), dtype=np.int64)}),
                              "not floating point")
    with open(tmp_path / "obj.npz", "wb") as fh:
        np.savez(fh, W=np.array([{"a": 1}], dtype=object), U=np.zeros(2))
    out["object array"] = (tmp_path / "obj.npz", "object arrays")
    out["extra layer"] = (write(tmp_path, "extra.pt", "torch", dict(sd, **{"mlp.weight": torch.zeros(3, 3)})),
                          "besides the attention")
    out["nonzero bias"] = (write(tmp_path, "bias.pt", "torch", dict(sd, **{"q_proj.bias": torch.ones(2 * D)})),
                           "nonzero bias")
    (tmp_path / "text.bin").write_bytes(b"hello, this is not a checkpoint")
    out["unknown format"] = (tmp_path / "text.bin", "not a format")
    out["unknown keys"] = (write(tmp_path, "keys.npz", "npz", {"A": np.zeros(3)}), "none of the layouts")
    huge = tmp_path / "huge.pt"
    with open(huge, "wb") as fh:                      # a sparse file: no disk is used
        fh.truncate(ex.MAX_CHECKPOINT_BYTES + 1)
    out["huge"] = (huge, "MiB")
    return out


def test_wrong_files_get_one_line_errors_before_any_compute(tmp_path):
    for what, (path, message) in _bad_files(tmp_path).items():
        with pytest.raises(ex.CheckpointError) as info:
            ex.read_checkpoint(path)
        text = str(info.value)
        assert message in text and "\n" not in text, (what, text)


def test_a_layout_that_does_not_fit_and_a_mismatch_with_the_tasks_name_both(tmp_path):
    model = project_model()
    path = write(tmp_path, "sd.pt", "torch", authors_state_dict(model))
    with pytest.raises(ex.CheckpointError, match="--layout factored does not fit"):
        ex.read_checkpoint(path, layout="factored")
    e = ex.read_checkpoint(path)
    with pytest.raises(ex.CheckpointError, match=r"width d \+ m = 7, but --tasks 2,2 gives d \+ m = 4 \+ 2 = 6"):
        ex.check_against(e, (2, 2))
    with pytest.raises(ex.CheckpointError, match="m = 2 outputs.*--tasks 7 gives m = 1"):
        ex.check_against(e, (7,))
    with pytest.raises(ex.CheckpointError, match="does not apply to the authors' layout"):
        ex.read_checkpoint(path, logit_scale=2.0)
