"""``python -m reports.audit`` end to end (issue 27): a report the schema accepts, judged where the
paper's account applies and bounded where it does not, a trajectory checked against claims 3-4, and
bad arguments refused with one line before anything is computed or written."""
from __future__ import annotations

import io
import json
import math
import os
import pickle

import numpy as np
import pytest
import torch

import claims.audit as ma
from numerics.config import ProblemConfig
from numerics.io import parse_json
from numerics.model import MultiHeadAttention
from numerics.train import TrainConfig, train
from reports import audit
from reports.render import document_problems
from theory.exact import exact_fixed_point

TASKS, L = (2, 2), 32


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def save_factored(path, model):
    with open(path, "wb") as fh:
        np.savez(fh, **{k: p.detach().numpy() for k, p in model.named_parameters()},
                 logit_scale=np.array(model.cfg.logit_scale))
    return str(path)


def allocated_checkpoint(tmp_path):
    fp = exact_fixed_point(TASKS, L)
    cfg = ProblemConfig(tasks=TASKS, heads=2, L=L, logit_scale=2.0)
    return save_factored(tmp_path / "allocated.npz",
                         MultiHeadAttention.from_semi_singular_values(cfg, np.diag(fp["omega_star"]),
                                                                      np.diag(fp["mu_star"])))


def untrained_authors_checkpoint(tmp_path):
    """PyTorch's default start in the authors' layout: off D, and it has learned nothing."""
    D = sum(TASKS) + len(TASKS)
    cfg = ProblemConfig(tasks=TASKS, heads=2, L=L, logit_scale=math.sqrt(D), init="uniform_full", init_scale=1.0)
    m = MultiHeadAttention(cfg)
    sd = {"q_proj.weight": torch.cat(list(m.Q.detach()), 0), "k_proj.weight": torch.cat(list(m.K.detach()), 0),
          "v_proj.weight": torch.cat(list(m.V.detach()), 0), "o_proj.weight": torch.cat(list(m.O.detach()), 1)}
    path = tmp_path / "untrained.pt"
    torch.save(sd, str(path))
    return str(path)


def run(argv):
    err = io.StringIO()
    return audit.main(argv + ["--no-progress"], stream=err), err.getvalue()


FAST = ["--skip", "one-head-optimum,best-decomposable"]
"""The default suite leaves out the two costly reference points (theory's one-head optimum derives its
start symbolically, ~11 CPU s per process; the best decomposable point is a Monte-Carlo search):
test_the_full_audit runs them (marker e2e)."""


def test_two_models_one_judged_inside_one_bounded_outside(tmp_path, one_thread):
    out = tmp_path / "report"
    rc, err = run([allocated_checkpoint(tmp_path), untrained_authors_checkpoint(tmp_path), "--tasks", "2,2", "--L",
                   str(L), "--assume-converged", "--out", str(out)] + FAST)
    doc = parse_json((out / "claims.json").read_text())
    assert document_problems(doc, strict=True) == []
    by_id = {c["id"]: c for c in doc["claims"]}
    # the allocated model: inside the account, judged two-sidedly, every wrong prediction rejected
    assert (by_id["model-1"]["kind"], by_id["model-1"]["verdict"]) == ("claim", "pass"), by_id["model-1"]["details"]
    names = [c["name"] for c in by_id["model-1"]["details"]["comparisons"]]
    assert any("vs the exact allocated fixed point" in n for n in names) and any(n.startswith("served") for n in names)
    # the untrained authors'-layout model: off D, and it did not learn anything -- the one-sided check fails
    assert (by_id["model-2"]["kind"], by_id["model-2"]["verdict"]) == ("boundary", "contradicted")
    assert rc == 1
    m1, m2 = doc["model"]
    assert (m1["judged"], m2["judged"]) == ("model-1", "model-2")
    assert m1["readout"]["words"] == "allocated" and m2["readout"]["words"] == "off D"
    assert m2["checkpoint"]["layout"] == "authors" and m2["checkpoint"]["picked"].startswith("auto")
    assert m1["held_out_loss"]["per_task_mean"]["mean"] == pytest.approx(m1["held_out_loss"]["mean"] / 2)
    assert m1["theory"]["allocated_fixed_point"]["available"] and m1["theory"]["linear_attention"]["available"]
    assert m1["theory"]["one_head_optimum"] == {"available": False, "reason": "skipped (--skip)", "seconds": 0.0,
                                                "cpu_seconds": 0.0}
    assert m1["position"]["allocated_fixed_point"]["relation"] == "indistinguishable"
    assert {f["kind"] for f in doc["findings"]} >= {"holds", "stops", "beyond"}
    page = (out / "index.html").read_text()
    assert "allocated.npz" in page and "<script" not in page and page.count("data:image/png;base64,") == 4
    # a second audit into the same directory replaces the previous report
    rc2, _ = run([allocated_checkpoint(tmp_path), "--tasks", "2,2", "--L", str(L), "--assume-converged", "--out",
                  str(out)] + FAST)
    assert rc2 == 0 and len(parse_json((out / "claims.json").read_text())["model"]) == 1


def test_a_model_off_the_fixed_point_fails_the_served_comparison(tmp_path, one_thread):
    """mu 10% below mu*: the served comparison, resolved by the first-order gradient noise, rejects
    it.  The held-out loss moves only at second order (0.82 against 0.78, about 5 se on the prompts
    the sizing draws), so whether it rejects too depends on the prompts; it is not asserted."""
    fp = exact_fixed_point(TASKS, L)
    cfg = ProblemConfig(tasks=TASKS, heads=2, L=L, logit_scale=2.0)
    path = save_factored(tmp_path / "low_mu.npz", MultiHeadAttention.from_semi_singular_values(
        cfg, np.diag(fp["omega_star"]), 0.9 * np.diag(fp["mu_star"])))
    plan = ma.plan_audit(ma.AuditRequest(checkpoints=(path,), tasks=TASKS, L=L, assume_converged=True,
                                         skip=("one_head_optimum", "best_decomposable")))
    result = ma.run_audit(plan).results[0]
    assert (result.kind, result.verdict) == ("claim", "fail")
    _, served = result.details["comparisons"]
    assert not served["agrees"] and 1.5 < served["error"] < 10, served


def test_bad_arguments_exit_2_and_write_nothing(tmp_path):
    good = allocated_checkpoint(tmp_path)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))
    evil = tmp_path / "evil.pt"
    evil.write_bytes(pickle.dumps({"K": Payload()}))
    foreign = tmp_path / "thesis"
    foreign.mkdir()
    (foreign / "chapter1.tex").write_text("keep me")
    cases = {
        "pickled payload": ([str(evil), "--tasks", "2,2", "--L", "32"], "refused"),
        "tasks mismatch": ([good, "--tasks", "2,3", "--L", "32"], "--tasks 2,3"),
        "no problem": ([good], "give --tasks and --L"),
        "times count": ([good, "--tasks", "2,2", "--L", "32", "--times", "1,2"], "--times has 2 entries"),
        "steps without lr": ([good, "--tasks", "2,2", "--L", "32", "--steps", "100"], "--steps needs --lr"),
        "missing file": ([str(tmp_path / "nope.pt"), "--tasks", "2,2", "--L", "32"], "no such file"),
        "bad tasks text": ([good, "--tasks", "2,,2", "--L", "32"], "--tasks"),
    }
    for what, (argv, message) in cases.items():
        out = tmp_path / f"out-{what.replace(' ', '-')}"
        rc, err = run(argv + ["--out", str(out)])
        assert rc == 2, (what, err)
        assert message in err and "Traceback" not in err, (what, err)
        assert len([ln for ln in err.splitlines() if "error:" in ln]) == 1, (what, err)
        assert not out.exists(), what
    assert not marker.exists()
    rc, err = run([good, "--tasks", "2,2", "--L", "32", "--out", str(foreign)])
    assert rc == 2 and "not an output of this command" in err
    assert sorted(os.listdir(foreign)) == ["chapter1.tex"]


def test_the_schema_accepts_model_and_names_what_is_wrong():
    entry = {"id": "model-1", "title": "t", "statement": "s", "verdict": "pass", "kind": "claim", "theory": {},
             "numerics": {}, "tolerance": {}, "details": {}, "figure_data": [], "perturbations": [], "seconds": 0.0,
             "headline": [], "findings": [], "figures": [], "figure_errors": [], "paper": None}
    prov = {"versions": {p: "x" for p in ("python", "torch", "numpy", "scipy", "sympy", "mpmath", "matplotlib")},
            "device": "cpu", "seed": 0, "profile": "audit", "wall_seconds": {"per_claim": {}, "total": 0.0},
            "cpu_seconds": {}, "git": {"commit": "x", "dirty": False}, "command": [], "started_utc": "", "seeds": {}}
    good = {k: None for k in ("index", "checkpoint", "readout", "held_out_loss", "theory", "position")}
    doc = {"claims": [entry], "findings": [], "provenance": prov, "model": [{**good, "judged": "model-1"}]}
    assert document_problems(doc, strict=True) == []
    assert document_problems({**doc, "model": [{**good, "judged": "model-9"}]})[0].startswith("model[0] is judged")
    assert "lacks" in document_problems({**doc, "model": [{"judged": None}]})[0]
    assert "optionally" in document_problems({**doc, "extra": 1})[0]


def test_a_trajectory_is_checked_against_claims_3_and_4(tmp_path, one_thread):
    """A run from a small decomposable start (claim 3's setting), checkpointed 11 times by the trainer's
    record hook: phases and winners against theory from the first checkpoint."""
    cfg = ProblemConfig(tasks=(3, 3), heads=2, L=32, logit_scale=4.0, init_scale=0.05)
    paths = []

    def save(step, t, model, loss):
        paths.append(save_factored(tmp_path / f"ck{step:04d}.npz", model))
    train(cfg, TrainConfig(lr=0.05, time=20.0, batch=256, records=21, seed=0), on_record=save)
    req = ma.AuditRequest(checkpoints=tuple(paths), tasks=(3, 3), L=32, steps=tuple(range(0, 401, 20)), lr=0.05,
                          loss_units="sum", prompts=2048, skip=("one_head_optimum", "best_decomposable"))
    plan = ma.plan_audit(req)
    assert plan.trajectory and plan.lr == pytest.approx(0.05) and plan.cases[-1].time == pytest.approx(20.0)
    result = ma.run_audit(plan)
    traj = next(r for r in result.results if r.id == "trajectory")
    assert traj.kind == "claim", traj.details.get("undecided")
    names = [c["name"] for c in traj.details["comparisons"]]
    assert any(n.startswith("phase times") for n in names) and any(n.startswith("winners") for n in names)
    phases = next(c for c in traj.details["comparisons"] if c["name"].startswith("phase times"))
    assert phases["agrees"] and all(p["rejected"] for p in phases["perturbations"]), phases
    assert [e["judged"] for e in result.model].count(None) == 20   # only the last checkpoint is judged
    last = next(r for r in result.results if r.id == "model-1")
    assert last.details["converged"]["descent"] is not None
    json.dumps(result.model)                  # the model entries are JSON as they stand
    # findings read the comparisons' structured fields (details["role"]), never their names
    for r in (traj, last):
        texts = [f.text for f in r.findings]
        spec_findings = ma.trajectory_findings if r is traj else ma.model_findings
        assert [f.text for f in spec_findings(r)] == texts and texts
        for c in r.details["comparisons"]:
            c["name"] = "renamed"
        assert [f.text for f in spec_findings(r)] == texts


def test_units_of_the_authors_steps(tmp_path):
    """torch's MSELoss averages over the m tasks: one of its steps at lr is one of ours at lr/m."""
    path = allocated_checkpoint(tmp_path)
    plan = ma.plan_audit(ma.AuditRequest(checkpoints=(path, path), tasks=TASKS, L=L, steps=(100, 300), lr=0.01))
    assert [c.time for c in plan.cases] == pytest.approx([0.01 * 100 / 2, 0.01 * 300 / 2])
    assert plan.lr == pytest.approx(0.005) and plan.trajectory
    plan = ma.plan_audit(ma.AuditRequest(checkpoints=(path,), tasks=TASKS, L=L, steps=(100,), lr=0.01,
                                         loss_units="sum"))
    assert plan.cases[0].time == pytest.approx(1.0)


@pytest.mark.e2e
def test_the_full_audit(tmp_path, one_thread):
    """The command as a researcher types it: every reference point computed (the one-head optimum and
    the best decomposable search included), one checkpoint, its own time printed."""
    out = tmp_path / "report"
    rc, err = run([allocated_checkpoint(tmp_path), "--tasks", "2,2", "--L", str(L), "--assume-converged",
                   "--out", str(out)])
    doc = parse_json((out / "claims.json").read_text())
    assert rc == 0 and document_problems(doc, strict=True) == []
    theory = doc["model"][0]["theory"]
    assert all(r["available"] for r in theory.values()), theory
    ladder = [theory[k]["loss"] for k in ("linear_attention", "best_decomposable", "allocated_fixed_point",
                                          "one_head_optimum")]
    assert ladder == sorted(ladder)           # theory's four points in their known order at (2, 2), L = 32
    assert doc["provenance"]["wall_seconds"]["total"] > 0 and doc["provenance"]["cpu_seconds"]["total"] > 0
