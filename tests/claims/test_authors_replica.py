"""The authors' released experiment, trained here and audited (issue 28: numerics.experiments.authors,
claims.authors_replica, the inits ``linear_default`` and ``authors_small``).

Default suite: their DataGenerator's blocks, the unit conversion (their MSELoss step at lr is ours at
lr / m), the two inits against their definitions (nn.Linear's kaiming-uniform bound; K = Q = a c I,
the OV diagonal), the CPU note, the plan, and the whole id at its tiny profile (seconds).  ``--e2e``:
the reduced CPU run at their sizes (a few minutes on 2 cores); ``--thorough``: the pieces of theory's
reference points against one call."""
import math

import numpy as np
import pytest
import torch

import claims
from claims import OPT_IN, REGISTRY
from claims import authors_replica as ar
from numerics.config import ProblemConfig
from numerics.config import make_generator, sample_prompts
from numerics.experiments import authors
from numerics.model import MultiHeadAttention, initial_semi_singular_values, mse_loss


def test_datagenerator_blocks_are_theirs():
    # their DataGenerator: task i reads x[int(i dx / dy) : int((i + 1) dx / dy)]
    assert authors.datagenerator_blocks(50, 3) == (16, 17, 17)
    assert authors.datagenerator_blocks(50, 1) == (50,)
    assert authors.datagenerator_blocks(6, 3) == (2, 2, 2)
    with pytest.raises(ValueError, match="1 <= dy <= dx"):
        authors.datagenerator_blocks(2, 3)


def test_units_their_step_is_ours_at_lr_over_m():
    run = authors.AuthorsRun(dy=3, heads=3, init="linear_default", steps=15_000)
    assert run.tasks == (16, 17, 17) and run.L == 100 and run.batch == 10_000
    assert math.isclose(run.our_lr, 0.01 / 3) and math.isclose(run.t_end, 50.0)
    assert math.isclose(run.logit_scale, math.sqrt(53)) and run.cfg.init_scale == 1.0
    # the reason: their MSELoss (a mean over the m outputs) is our loss / m, so are its gradients
    cfg = ProblemConfig(tasks=(2, 2, 2), heads=3, L=8, logit_scale=math.sqrt(9), init="linear_default",
                        init_scale=1.0)
    model = MultiHeadAttention(cfg)
    p = sample_prompts(cfg, 64, make_generator(0, "cpu"))
    ours = mse_loss(model(p.context, p.query), p.target)
    g_ours = torch.autograd.grad(ours, list(model.parameters()))
    theirs = torch.nn.MSELoss()(model(p.context, p.query), p.target)
    g_theirs = torch.autograd.grad(theirs, list(model.parameters()))
    assert torch.isclose(theirs * cfg.m, ours, rtol=1e-12)
    assert all(torch.allclose(a * cfg.m, b, rtol=1e-10, atol=1e-14) for a, b in zip(g_theirs, g_ours))
    with pytest.raises(ValueError, match="init must be one of"):
        authors.AuthorsRun(dy=3, heads=3, init="uniform_full", steps=10)
    with pytest.raises(ValueError, match="steps must be a positive integer"):
        authors.AuthorsRun(dy=3, heads=3, init="linear_default", steps=0)


def test_linear_default_is_nn_linear_default():
    """Each projection at nn.Linear's default: kaiming_uniform(a = sqrt 5) is U(+-1/sqrt(fan_in));
    q, k, v read a token (fan_in D), o_proj the H concatenated head outputs (fan_in H D)."""
    cfg = ProblemConfig(tasks=(3, 4), heads=5, L=8, logit_scale=3.0, init="linear_default", init_scale=1.0,
                        init_seed=3)
    D, H = cfg.token_dim, cfg.heads
    model = MultiHeadAttention(cfg)

    def torch_bound(fan_in):      # what torch.nn.Linear.reset_parameters gives its weight
        gain = torch.nn.init.calculate_gain("leaky_relu", math.sqrt(5))
        return gain * math.sqrt(3.0 / fan_in)
    for name, fan_in in (("K", D), ("Q", D), ("V", D), ("O", H * D)):
        w = getattr(model, name).detach()
        b = torch_bound(fan_in)
        assert math.isclose(b, 1 / math.sqrt(fan_in), rel_tol=1e-12)
        assert float(w.abs().max()) <= b and float(w.abs().max()) > 0.9 * b, name   # fills its interval
    # the project's uniform_full keeps its bound 1/sqrt(D) on O (unchanged): the two differ only there
    full = MultiHeadAttention(cfg.replace(init="uniform_full"))
    assert float(full.O.detach().abs().max()) > 1 / math.sqrt(H * D)
    again = MultiHeadAttention(cfg)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters()))
    with pytest.raises(ValueError, match="needs param='factored'"):
        ProblemConfig(tasks=(2,), heads=1, L=4, param="merged", init="linear_default")


def test_authors_small_is_their_small_init():
    """K_h = Q_h = a_h c I with one standard normal a_h per head, c = L^(-3/4); the OV diagonal c,
    2c on the head's task; its readout is the stated point of D."""
    cfg = ProblemConfig(tasks=(2, 3, 1), heads=4, L=16, logit_scale=math.sqrt(9), init="authors_small",
                        init_scale=1.0, init_seed=7)
    d, m, D, H = cfg.d, cfg.m, cfg.token_dim, cfg.heads
    model = MultiHeadAttention(cfg)
    K, Q, V, O = (getattr(model, n).detach() for n in ("K", "Q", "V", "O"))
    c = 16 ** -0.75
    a = np.random.default_rng(7).standard_normal(H)
    assert torch.equal(K, Q)
    assert torch.allclose(K, torch.as_tensor(a * c)[:, None, None] * torch.eye(D, dtype=torch.float64), atol=0)
    v = np.full((H, m), c)
    v[np.arange(H), np.arange(H) % m] = 2 * c          # head h favours task h mod m (theirs: head i, task i)
    for h in range(H):
        assert torch.allclose(V[h], torch.block_diag(torch.zeros(d, d, dtype=torch.float64),
                                                     torch.diag(torch.as_tensor(v[h]))))
        assert torch.allclose(O[h, :, d:], torch.diag(torch.as_tensor(v[h]))) and float(O[h, :, :d].abs().max()) == 0
    omega, mu = initial_semi_singular_values(cfg)
    r = model.semi_singular_values()
    assert np.allclose(r.omega, omega.numpy(), rtol=1e-12) and np.allclose(r.mu, mu.numpy(), rtol=1e-12)
    assert np.allclose(omega.numpy(), (a ** 2 * c ** 2 / cfg.logit_scale)[:, None]) and np.allclose(mu, v ** 2)
    with pytest.raises(ValueError, match="needs param='factored'"):
        ProblemConfig(tasks=(2,), heads=1, L=4, param="merged", init="authors_small")


def test_profile_is_opt_in_and_reduced_on_a_cpu():
    assert REGISTRY["authors-replica"] == "claims.authors_replica:SPEC" and "authors-replica" in OPT_IN
    run, note = ar.effective(ar.PROFILES["authors"], "cpu")
    assert run is ar.REDUCED and note.startswith("reduced run on the CPU: 30 of the stated 15000 SGD steps")
    assert "t = 0.1 (of 50) at d_y = 3" in note and "one-sidedly" in note and "undecided" in note
    run, note = ar.effective(ar.PROFILES["authors"], "cuda")
    assert run is ar.STATED and note is None


def test_plan_is_the_eight_runs_their_references_and_flows():
    """The plan (trains nothing): eight runs, one program per shape (the two starts of a shape on
    one prompt stream), theory's points in pieces per task split, the small inits' flows."""
    from numerics.engine import jobs_of

    plan = claims.plan_of("authors-replica", "authors")           # on the CPU: the reduced run
    runs = [n for n in plan if n.kind == "authors_run"]
    assert len(runs) == 8 and {(authors.datagenerator_blocks(n.args["dx"], n.args["dy"]), n.args["heads"])
                               for n in runs} == {((16, 17, 17), 3), ((16, 17, 17), 8), ((50,), 3), ((50,), 8)}
    assert [n.args["init"] for n in runs[:2]] == ["linear_default", "authors_small"]
    assert all(n.args["steps"] == 30 and n.args["held_out"] == 4096 for n in runs)
    assert sorted(len(j) for j in jobs_of(runs)) == [2, 2, 2, 2]
    assert runs[0].seed(0) == runs[1].seed(0) != runs[2].seed(0)    # one prompt stream per shape
    pieces = [n for n in plan if n.kind == "reference_points"]
    assert sorted((len(n.args["tasks"]), n.args["heads"]) for n in pieces) == [
        (1, (3,)), (1, (3, 8)), (1, (8,)), (3, (3,)), (3, (3, 8)), (3, (8,))]   # shared, best at H = 3, 8
    flows = [n for n in plan if n.kind == "authors_emergence"]
    assert len(flows) == 4 and all(n.stream == r.stream for n, r in zip(flows, runs[1::2]))
    assert claims.estimate_seconds("authors-replica", "authors") < 600        # the CPU's reduced run: minutes


def test_tiny_trains_audits_and_stays_undecided():
    r = ar.SPEC.run(profile="tiny", device="cpu", seed=0)
    d = r.details
    assert r.kind == "boundary" and r.verdict == "undecided", (r.verdict, d.get("undecided"))
    assert d["note"].startswith("reduced run: 40 of the stated 15000 SGD steps")
    assert len(d["runs"]) == 4
    for e in d["runs"]:
        assert "error" not in e
        assert math.isclose(e["t_end"], 0.1 * 40 / e["dy"]) and math.isclose(e["our_lr"], 0.1 / e["dy"])
        assert len(e["trajectory"]) == 5 and e["trajectory"][-1]["step"] == 40
        assert [a["id"] for a in e["audit"]["results"]] == ["model-1"]          # cut short: no trajectory
        assert e["model"]["converged"]["value"] is None
    # a model on D is compared one-sidedly; off D it is not compared (no learned-something check)
    names = [c["name"] for c in d["comparisons"]]
    assert names and all("not below the exact allocated fixed point" in n for n in names), names
    assert not any("learned something" in n for n in names)
    assert any(f.kind == "stops" and "reduced" in f.text for f in r.findings)
    # the same comparison rejects a wrong prediction: the fixed point's loss moved up past the measured
    c = d["comparisons"][0]
    assert c["agrees"] and any(p["rejected"] for p in c["perturbations"])


@pytest.mark.e2e
def test_reduced_cpu_run_at_their_sizes():
    """The stated profile on the CPU: 30 of their steps at d_x = 50, L = 100, batch 10,000, eight runs."""
    r = ar.SPEC.run(profile="authors", device="cpu", seed=0)
    d = r.details
    assert d["steps"] == 30 and d["note"].startswith("reduced run on the CPU")
    assert r.verdict in ("undecided", "contradicted"), r.verdict
    assert len(d["runs"]) == 8 and all("error" not in e for e in d["runs"])
    for e in d["runs"]:
        assert len(e["trajectory"]) == ar.REDUCED.snapshots
        first, last = e["trajectory"][0]["loss"], e["trajectory"][-1]["loss"]
        assert math.isfinite(last["mean"]) and last["mean"] < 1.1 * first["mean"], e["label"]
        if e["init"] == "linear_default":       # its random outputs' loss goes first (same held-out prompts)
            assert last["mean"] < first["mean"], e["label"]
        else:                                   # the small init: theory's emergence is far beyond the run
            assert e["emergence_prediction"]["steps"] > 30, e["label"]
    # only the small-init models (on D) are compared, one-sidedly; the nn.Linear-default ones (off D) are not
    assert sorted(c["name"].split(" at ")[0] for c in d["comparisons"]) == sorted(
        e["label"] for e in d["runs"] if e["init"] == "authors_small")


@pytest.mark.thorough
def test_theory_pieces_assemble_to_references_for_heads():
    """The pieces of theory's reference points (needs computed side by side) give what one call
    gives (thorough: theory's points twice, about 20 CPU s)."""
    from numerics.engine import Engine
    from numerics.reference_points import references_for_heads

    search = {"random_starts": 1, "fit_elements": 2 ** 12, "eval_prompts": 256}
    p = ar.AuthorsProfile(dx=3, dys=(2,), heads=(2, 3), L=8, skip=(), search=tuple(sorted(search.items())))
    needs = ar.reference_needs(p, (2, 1))
    assert list(needs) == ["shared", "one_head", ("best", 2), ("best", 3)]
    done = Engine(seed=0).run(needs.values())
    got = ar._assemble({piece: done[n] for piece, n in needs.items()})
    want = references_for_heads((2, 1), [2, 3], 8, 0.0, 0, "cpu", search, skip=("best_decomposable",))
    assert sorted(got) == [2, 3]
    for H in (2, 3):
        # the best decomposable point is a search drawn from its own piece's seed
        want[H]["best_decomposable"] = references_for_heads((2, 1), [H], 8, 0.0, needs[("best", H)].seed(0), "cpu",
                                                             search)[H]["best_decomposable"]
        for name in ("allocated_fixed_point", "one_head_optimum", "best_decomposable", "linear_attention"):
            assert got[H][name]["available"] and math.isclose(got[H][name]["loss"], want[H][name]["loss"],
                                                              rel_tol=1e-12), (H, name)
        assert got[H]["linear_attention"]["reachable"] == want[H]["linear_attention"]["reachable"]
    one_task = ar.AuthorsProfile(dx=4, dys=(1,), heads=(3,), L=8, skip=("best_decomposable",))
    assert list(ar.reference_needs(one_task, (4,))) == ["shared"]
