"""The audit decides or says what it needs: each judged model is measured on as many held-out prompts as
reject its wrong predictions (claims.audit.sized), a model that agrees never reads ``error`` (it
passes, or is undecided with "needs N prompts"), nothing is skipped silently (a comparison not made is a
row, a result with none made is undecided), a trajectory checkpointed densely early and sparsely late has
its phases judged (each crossing resolved to the checkpoints around it), and the page opens on its
verdicts with the checkpoint list folded."""
from __future__ import annotations

import io
import math
import re
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

import claims.audit as ma
from claims.core import ClaimSpec, Outcome, compare, reported_row
from numerics.config import ProblemConfig
from numerics.io import parse_json
from numerics.model import MultiHeadAttention
from numerics.evaluate import Z_SE
from numerics.train import TrainConfig, train
from reports import audit
from reports.render import document_problems
from theory.exact import exact_fixed_point
from theory.three_phases import PhaseTimes, phases_resolved

TASKS, L = (2, 2), 32
FAST = ["--skip", "one-head-optimum,best-decomposable"]
"""The two costly reference points left out (tests/test_audit_report.py's test_the_full_audit runs them)."""


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


def model_at(tmp_path, name, omega, mu, s=math.sqrt(6.0)):
    """A (2, 2), H = 2 model with served values omega, mu on the diagonal (the authors' logit scale sqrt(D))."""
    cfg = ProblemConfig(tasks=TASKS, heads=2, L=L, logit_scale=s)
    return save_factored(tmp_path / name, MultiHeadAttention.from_semi_singular_values(cfg, np.diag(omega), np.diag(mu)))


def run(argv):
    err, out = io.StringIO(), io.StringIO()
    from contextlib import redirect_stdout
    with redirect_stdout(out):
        rc = audit.main(argv + ["--no-progress"], stream=err)
    return rc, out.getvalue(), err.getvalue()


def claims_of(out_dir):
    doc = parse_json((out_dir / "claims.json").read_text())
    assert document_problems(doc, strict=True) == []
    return doc, {c["id"]: c for c in doc["claims"]}


NEEDS = re.compile(r"needs (\d+) prompts \(about \d+ s\): --prompts (\d+)")


def test_a_model_at_the_fixed_point_is_sized_and_never_reads_error(tmp_path, one_thread):
    """At theory's fixed point (and at a point 1.3% off it in mu, as a model trained elsewhere sits), the
    default audit passes or, where its cap binds, is undecided and names the prompts that would decide:
    16384 prompts, the old default, leave omega* x 1.1 unrejected at (2, 2), L = 32."""
    fp = exact_fixed_point(TASKS, L)
    exact = model_at(tmp_path, "exact.npz", fp["omega_star"], fp["mu_star"])
    near = model_at(tmp_path, "near.npz", [0.852, 0.852], [1.15, 1.15])
    common = ["--tasks", "2,2", "--L", str(L), "--assume-converged"] + FAST
    rc, stdout, _ = run([exact, near] + common + ["--out", str(tmp_path / "sized")])
    doc, by_id = claims_of(tmp_path / "sized")
    assert rc == 0, stdout
    for rid in ("model-1", "model-2"):
        c, sizing = by_id[rid], by_id[rid]["details"]["sizing"]
        assert sizing["pilot"] == ma.PILOT_PROMPTS and sizing["needed"] > ma.PILOT_PROMPTS
        assert c["details"]["loss"]["n"] == sizing["n"] == min(sizing["needed"], sizing["cap"])
        assert all(x["agrees"] for x in c["details"]["comparisons"]), c["details"]["comparisons"]
        if c["verdict"] == "undecided":           # only where the cap binds, and then it names the count
            assert sizing["cap"] < sizing["needed"] and NEEDS.search(c["details"]["undecided"]), c["details"]
        else:
            assert (c["kind"], c["verdict"]) == ("claim", "pass"), c["details"]
            assert all(p["rejected"] for x in c["details"]["comparisons"] for p in x["perturbations"])
    # the old default count, as an explicit override: the model agrees, cannot reject a 10% error, says so
    rc, stdout, _ = run([near] + common + ["--prompts", "16384", "--out", str(tmp_path / "fixed")])
    _, by_id = claims_of(tmp_path / "fixed")
    c = by_id["model-1"]
    assert rc == 0 and (c["kind"], c["verdict"]) == ("claim", "undecided")
    assert all(x["agrees"] for x in c["details"]["comparisons"])
    need = NEEDS.search(c["details"]["undecided"])
    assert need and int(need.group(1)) > 16384 and need.group(1) == need.group(2)
    assert "model-1 (near.npz): claim undecided: agrees, but on 16384 held-out prompts" in stdout
    assert NEEDS.search(stdout)
    # a prompt cap below the need: undecided, with the count that would decide
    rc, stdout, _ = run([near] + common + ["--max-prompts", "8192", "--out", str(tmp_path / "capped")])
    _, by_id = claims_of(tmp_path / "capped")
    c = by_id["model-1"]
    assert rc == 0 and c["verdict"] == "undecided" and c["details"]["sizing"]["n"] == 8192
    assert int(NEEDS.search(c["details"]["undecided"]).group(1)) > 8192


def test_a_model_off_the_fixed_point_still_fails_when_sized(tmp_path, one_thread):
    """Sizing cannot turn a disagreement into a pass: mu 10% below mu* fails its served comparison."""
    fp = exact_fixed_point(TASKS, L)
    path = model_at(tmp_path, "low_mu.npz", fp["omega_star"], 0.9 * np.asarray(fp["mu_star"]))
    plan = ma.plan_audit(ma.AuditRequest(checkpoints=(path,), tasks=TASKS, L=L, assume_converged=True,
                                         skip=("one_head_optimum", "best_decomposable")))
    result = ma.run_audit(plan).results[0]
    assert (result.kind, result.verdict) == ("claim", "fail"), result.details.get("undecided")


def test_the_count_depends_on_the_noise_and_the_prediction_never_on_the_measurement():
    fixed = {"loss": 0.78, "error_estimate": 1e-12}
    counts = {ma.prompts_needed([ma.check_fixed_point_loss("l", SimpleNamespace(mean=m, se=0.02, n=4096), 0.0, fixed,
                                                           "c")])[0] for m in (0.70, 0.78, 0.80, 2.0)}
    assert len(counts) == 1
    n = counts.pop()
    # the binding wrong prediction is the loss / 1.1: tolerance Z_SE se sqrt(4096 / n) = half its distance
    assert Z_SE * 0.02 * math.sqrt(4096 / n) == pytest.approx(0.78 * (1 - 1 / 1.1) / 2)
    big_fixed = ma.check_fixed_point_loss("l", SimpleNamespace(mean=0.78, se=0.02, n=4096), 0.05, fixed, "c")
    assert ma.prompts_needed([big_fixed])[0] == math.inf and ma.sized_count(math.inf) is None


@given(p=st.floats(0.1, 10.0), rel_se=st.floats(1e-3, 0.2), fixed=st.floats(0.0, 0.04), u=st.floats(-1.0, 1.0))
def test_at_the_sized_count_an_agreeing_measurement_rejects_every_wrong_prediction(p, rel_se, fixed, u):
    """The sizing's promise: at the count it names, any measurement within tolerance of the prediction
    lies outside the tolerance of each wrong prediction (tolerance < half their distance)."""
    ref = {"loss": p, "error_estimate": 0.0}
    pilot = ma.check_fixed_point_loss("l", SimpleNamespace(mean=p, se=rel_se * p, n=4096), fixed * p, ref, "c")
    n = max(ma.sized_count(ma.prompts_needed([pilot])[0]), 4096)
    tol = Z_SE * rel_se * p * math.sqrt(4096 / n) + fixed * p
    c = ma.check_fixed_point_loss("l", SimpleNamespace(mean=p + u * tol, se=rel_se * p * math.sqrt(4096 / n), n=n),
                                  fixed * p, ref, "c")
    assert c.agrees and all(q.rejected for q in c.perturbations), c.explain()


def test_a_result_with_no_comparison_made_is_undecided_never_pass():
    nothing = Outcome([], [reported_row("not compared: phase times (too sparse)", None)], undecided=None)
    spec = ClaimSpec(id="trajectory", title="t", statement="s", profiles={}, evaluate=lambda ctx: nothing)
    req = ma.AuditRequest(checkpoints=("x",))
    r = ma.judged_result(spec, None, req, None)
    assert (r.kind, r.verdict) == ("claim", "undecided")
    assert audit.decided_by(r.to_dict()) == "no comparison was made"
    wrong = compare("w", 2.0, 1.0, 0.1, "a disagreement", wrong=[("x2", 2.0)])
    r = ma.judged_result(ClaimSpec(id="m", title="t", statement="s", profiles={}, evaluate=lambda ctx: Outcome(
        [wrong], undecided="cannot decide")), None, req, None)
    assert (r.kind, r.verdict) == ("claim", "fail")        # a disagreement decides, whatever else


def dense_early_run(tmp_path, keep):
    """One (2, 2), H = 2, L = 32 run from a small start (lr 0.05 ours = 0.1 on a mean loss, 1000 steps),
    checkpointed at the steps in ``keep``."""
    cfg = ProblemConfig(tasks=TASKS, heads=2, L=L, logit_scale=4.0, init_scale=0.05)
    paths = {}

    def save(step, t, model, loss):
        if step in keep:
            paths[step] = save_factored(tmp_path / f"ck{step:04d}.npz", model)
    train(cfg, TrainConfig(lr=0.05, time=50.0, batch=256, records=21, seed=0), on_record=save, record_every=4)
    return [paths[s] for s in sorted(paths)], sorted(paths)


def test_a_dense_early_trajectory_has_its_phases_judged(tmp_path, one_thread):
    """Checkpoints every 4 steps to step 200, then every 50 (67 in all): the largest gap (t = 2.5) exceeds
    theory's emergence, so the run-wide spacing refused the phases; each crossing lies between
    checkpoints 0.2 apart, and they are judged, the gap entering the tolerance."""
    keep = set(range(0, 201, 4)) | set(range(250, 1001, 50))
    paths, steps = dense_early_run(tmp_path, keep)
    assert len(paths) == 67
    out = tmp_path / "report"
    rc, stdout, err = run(paths + ["--tasks", "2,2", "--L", str(L), "--steps", ",".join(map(str, steps)), "--lr", "0.1",
                                   "--prompts", "4096", "--out", str(out)] + FAST)
    doc, by_id = claims_of(out)
    traj = by_id["trajectory"]
    phase = next(c for c in traj["details"]["comparisons"] if c["details"]["role"] == "phase times")
    assert phase["agrees"] and all(p["rejected"] for p in phase["perturbations"]), phase
    assert traj["verdict"] == "pass" and rc == 0, stdout
    for end in ("warmup_end", "emergence_end"):
        assert phase["details"]["tolerances"][end]["parts"]["bracketing_gap"] == pytest.approx(0.2)
    pred = PhaseTimes(**traj["details"]["predicted_phases"])
    assert not phases_resolved(pred, np.asarray(traj["details"]["t"]))[0]     # the run-wide gap would refuse
    # the figure's theory: the expansion flow, named with its offset from the exact fixed point it misses
    off = traj["details"]["expansion_offset"]
    assert off["beyond_tolerance"] and off["relative"] > 0.3 and off["exact"] == pytest.approx(
        exact_fixed_point(TASKS, L)["loss"])
    assert "66 earlier checkpoint(s) of the run" in stdout
    assert len([ln for ln in err.splitlines() if "layout factored" in ln]) == 1     # one line for the run's files
    page = (out / "index.html").read_text()
    # the page opens on the verdicts and the ladder; the 67 checkpoints are folded
    verdicts, folded, findings = (page.index(x) for x in ("<section id='verdicts'>", "<details id='checkpoints'>",
                                                          "<section id='findings'>"))
    assert page.index("<table") > verdicts and verdicts < folded < findings
    assert page.index('alt="loss ladder"') < folded
    assert page[folded:findings].count("<td>ck") == 67 and page[:folded].count("<tr>") <= 6
    assert "an earlier checkpoint" not in page[:folded]
    assert "expansion flow from the" in page and "off theory's exact allocated fixed point" in page


def test_a_sparse_run_says_what_it_did_not_compare(tmp_path, one_thread):
    """Five checkpoints 12.5 apart: the warm-up ends inside the first gap, so the phases are not compared;
    the winners are; the page and the terminal both carry the row that says so."""
    paths, steps = dense_early_run(tmp_path, {0, 250, 500, 750, 1000})
    out = tmp_path / "report"
    rc, stdout, _ = run(paths + ["--tasks", "2,2", "--L", str(L), "--steps", ",".join(map(str, steps)), "--lr", "0.1",
                                 "--prompts", "4096", "--out", str(out)] + FAST)
    doc, by_id = claims_of(out)
    traj = by_id["trajectory"]
    assert [c["details"]["role"] for c in traj["details"]["comparisons"]] == ["winners"]
    assert [x["what"] for x in traj["details"]["not_compared"]] == ["phase times"]
    assert "save them more often there" in traj["details"]["not_compared"][0]["why"]
    assert "  not compared: phase times (the checkpoints around" in stdout
    page = (out / "index.html").read_text()
    assert page.index("not compared") < page.index("<details id='checkpoints'>")


def test_prompts_and_its_caps_are_exclusive(tmp_path):
    rc, _, err = run(["x.npz", "--tasks", "2,2", "--L", "32", "--prompts", "4096", "--max-prompts", "8192",
                      "--out", str(tmp_path / "o")])
    assert rc == 2 and "give one or the other" in err and not (tmp_path / "o").exists()


def test_the_help_states_the_caps_the_audit_uses():
    text = " ".join(audit.make_parser().format_help().split())
    assert f"(default {ma.MAX_PROMPTS})" in text and f"(default {ma.MAX_SECONDS / 60:g});" in text
    assert f"a pilot of {ma.PILOT_PROMPTS} prompts" in text


def test_a_run_with_nothing_compared_is_undecided_with_its_reasons(tmp_path, one_thread):
    """One head on one task, five checkpoints 5 apart: no race between heads to predict, and theory's
    warm-up ends inside the first gap -- nothing compared, so the trajectory reads undecided (never pass,
    never error), each reason a row."""
    cfg = ProblemConfig(tasks=(3,), heads=1, L=L, logit_scale=4.0, init_scale=0.05)
    paths = []
    train(cfg, TrainConfig(lr=0.05, time=20.0, batch=256, records=5, seed=0),
          on_record=lambda step, t, model, loss: paths.append(save_factored(tmp_path / f"ck{step:04d}.npz", model)))
    out = tmp_path / "report"
    rc, stdout, _ = run(paths + ["--tasks", "3", "--L", str(L), "--times", "0,5,10,15,20", "--prompts", "2048",
                                 "--out", str(out)] + FAST)
    _, by_id = claims_of(out)
    traj = by_id["trajectory"]
    assert (traj["verdict"], traj["details"]["comparisons"]) == ("undecided", []) and rc == 0
    assert [x["what"] for x in traj["details"]["not_compared"]] == ["phase times", "winners"]
    assert stdout.count("  not compared: ") >= 2 and "trajectory: claim undecided: phase times: " in stdout
