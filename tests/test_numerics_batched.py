"""Many runs as one program (numerics.train through numerics.train.train_many): every run's
numbers are those of the same run trained alone by train(), a run that diverges or whose hook
raises ends alone, and what cannot be batched falls back to train().

Tolerance of "the same to rounding": both sides compute the same sums in another kernel
order; over the few dozen steps here a float64 loss, readout or weight differs by at most a
few hundred ulp of its size (measured: 0 to 2e-15 relative), so 1e-11 relative leaves a
factor 1000 and still rejects a run whose prompts or update differ (a different seed moves
the losses by ~1e-2, a 1% change of the step moves them by ~1e-4: both checked to be seen).
"""
import math

import numpy as np
import pytest
import torch

from numerics.train import StackedAttention
from numerics.config import ProblemConfig
from numerics.config import Prompts, make_generator, sample_prompts
from numerics.model import MultiHeadAttention, TrainingDiverged, mse_loss
from numerics.train import TrainConfig, train, train_many

RTOL = 1e-11


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Small ops on one intra-op thread, as the experiments run them (numerics.experiments.one_thread):
    on a shared 2-core machine two threads make these steps several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _close(a, b, rtol=RTOL) -> bool:
    a, b = np.asarray(a, float), np.asarray(b, float)
    scale = max(float(np.max(np.abs(a))), float(np.max(np.abs(b))), 1e-300)
    return a.shape == b.shape and float(np.max(np.abs(a - b))) <= rtol * scale


def _same_run(alone, many, rtol=RTOL) -> bool:
    """Losses, every record (t, loss, omega, mu, residual), the tail loss and the final weights."""
    if alone.steps != many.steps or len(alone.trajectory) != len(many.trajectory):
        return False
    ok = _close(alone.losses, many.losses, rtol) and math.isclose(alone.loss, many.loss, rel_tol=rtol)
    for x, y in zip(alone.trajectory, many.trajectory):
        ok &= x.t == y.t and _close([x.loss, x.residual], [y.loss, y.residual], rtol)
        ok &= _close(x.omega, y.omega, rtol) and _close(x.mu, y.mu, rtol)
    for (n, p), (_, q) in zip(alone.final_model.named_parameters(), many.final_model.named_parameters()):
        ok &= _close(p.detach(), q.detach(), rtol)
    return bool(ok)


BASE = ProblemConfig(tasks=(2, 1), heads=2, L=8)


def _mixed_runs(base: ProblemConfig):
    """Runs of one shape that differ in everything train_many allows to differ: shared and own
    streams, init pattern and scale, sigma, lr, length, records, logit scale."""
    cfgs = [base, base.replace(init_scale=0.3), base.replace(init="random_full", init_seed=3, init_scale=0.5),
            base.replace(sigma=0.4), base.replace(logit_scale=2.0) if base.param == "factored" else base,
            base.replace(init="random_decomposable", init_seed=1)]
    tcfgs = [TrainConfig(lr=0.05, time=1.0, batch=32, records=5),
             TrainConfig(lr=0.05, time=1.0, batch=32, records=3),            # shares run 0's stream
             TrainConfig(lr=0.04, time=0.6, batch=32, records=4, seed=1),    # another stream, shorter
             TrainConfig(lr=0.05, time=0.8, batch=32, records=2),            # sigma: a stream of its own
             TrainConfig(lr=0.1, time=1.0, batch=32, records=6, seed=1),     # shares run 2's stream
             TrainConfig(lr=0.05, time=0.3, batch=32, records=2, seed=2)]
    return cfgs, tcfgs


@pytest.mark.parametrize("param, dtype", [("factored", "float64"), ("merged", "float64"), ("factored", "float32")])
def test_each_run_is_the_run_alone(param, dtype):
    cfgs, tcfgs = _mixed_runs(BASE.replace(param=param, dtype=dtype))
    many = train_many(cfgs, tcfgs)
    rtol = RTOL if dtype == "float64" else 1e-5        # float32: eps 1.2e-7, the same argument
    # the runs of the two-run streams (0, 1, 2, 4) are one program, those of their own stream another
    for c, t, m, program in zip(cfgs, tcfgs, many, (4, 4, 4, 2, 4, 2)):
        assert m.batched_runs == program and m.steps == t.steps
        assert _same_run(train(c, t), m, rtol)
    # the comparison can fail: another seed, or a step 1% off, is not the same run
    other = train(cfgs[0], TrainConfig(**{**tcfgs[0].to_dict(), "seed": 5}))
    assert not _same_run(other, many[0], rtol)
    off = train(cfgs[0], TrainConfig(**{**tcfgs[0].to_dict(), "lr": 0.0505, "time": 1.01}))
    assert not _close(off.losses[1:], many[0].losses[1:], rtol)


def test_one_stream_many_starts_shares_the_draw(monkeypatch):
    """Runs of one seed (an init-scale sweep) draw each step's batch once: steps + 1 draws for
    the program, not R (steps + 1)."""
    import numerics.train as T
    calls = {"n": 0}
    real = T.sample_prompts

    def counting(*args, **kwargs):
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(T, "sample_prompts", counting)
    cfgs = [BASE.replace(init_scale=s) for s in (0.05, 0.1, 0.2, 0.4)]
    tcfg = TrainConfig(lr=0.05, time=0.5, batch=16, records=3)
    many = train_many(cfgs, tcfg)
    assert calls["n"] == tcfg.steps + 1
    monkeypatch.setattr(T, "sample_prompts", real)
    for c, m in zip(cfgs, many):
        assert _same_run(train(c, tcfg), m)


def test_a_diverging_run_ends_alone():
    cfgs = [BASE, BASE.replace(init_scale=3.0), BASE.replace(init_scale=0.2)]
    tcfgs = [TrainConfig(lr=0.05, time=1.0, batch=16, records=3), TrainConfig(lr=50.0, time=500.0, batch=16, records=2),
             TrainConfig(lr=0.05, time=1.0, batch=16, records=3, seed=1)]
    many = train_many(cfgs, tcfgs)
    assert isinstance(many[1], TrainingDiverged)
    with pytest.raises(TrainingDiverged) as alone:
        train(cfgs[1], tcfgs[1])
    assert str(many[1]) == str(alone.value)              # the same step, time and loss
    for i in (0, 2):
        assert _same_run(train(cfgs[i], tcfgs[i]), many[i])


def test_hooks_see_the_run_and_a_raising_hook_ends_only_its_run():
    class Stop(Exception):
        pass

    seen_alone, seen_many = [], []

    def hook(store):
        def on_record(step, t, model, loss):
            store.append((step, t, loss, [p.detach().clone() for p in model.parameters()]))
            if step >= 6:
                raise Stop(f"stop at {step}")
        return on_record

    tcfg = TrainConfig(lr=0.05, time=1.0, batch=16, records=2)
    with pytest.raises(Stop):
        train(BASE, tcfg, on_record=hook(seen_alone), record_every=3)
    many = train_many([BASE, BASE.replace(init_scale=0.3)], tcfg, on_record=[hook(seen_many), None],
                      record_every=[3, None])
    assert isinstance(many[0], Stop) and str(many[0]) == "stop at 6"
    assert [s[:2] for s in seen_many] == [s[:2] for s in seen_alone] and [s[0] for s in seen_alone] == [0, 3, 6]
    for (_, _, la, pa), (_, _, lm, pm) in zip(seen_alone, seen_many):
        assert math.isclose(la, lm, rel_tol=RTOL) and all(_close(a, b) for a, b in zip(pa, pm))
    assert _same_run(train(BASE.replace(init_scale=0.3), tcfg), many[1])


def test_start_models_are_trained_in_place():
    tcfg = TrainConfig(lr=0.05, time=0.5, batch=16, records=2)
    starts = [MultiHeadAttention.from_semi_singular_values(BASE, np.full((2, 2), 0.1 * (k + 1)), np.full((2, 2), 0.2))
              for k in range(3)]
    alone = [train(BASE, tcfg, start=MultiHeadAttention.from_semi_singular_values(
        BASE, np.full((2, 2), 0.1 * (k + 1)), np.full((2, 2), 0.2))) for k in range(3)]
    many = train_many(BASE, [tcfg] * 3, start=starts)
    for s, a, m in zip(starts, alone, many):
        assert m.final_model is s and _same_run(a, m)


def test_fixed_batches_batch_sources_and_checkpoints(tmp_path):
    prompts = sample_prompts(BASE, 16, make_generator(7, "cpu"))
    fixed = TrainConfig(lr=0.05, time=0.5, batch=16, records=3, fresh_batches=False)
    ck = TrainConfig(lr=0.05, time=0.5, batch=16, records=3, checkpoint=str(tmp_path / "ck.pt"), checkpoint_every=4)
    fresh = TrainConfig(lr=0.05, time=0.5, batch=16, records=3)
    cfgs = [BASE, BASE.replace(init_scale=0.3), BASE, BASE]
    tcfgs = [fixed, fixed, fresh, ck]
    sources = [None, None, lambda k: prompts, None]
    many = train_many(cfgs, tcfgs, batches=sources)
    assert _same_run(train(BASE, fixed), many[0]) and _same_run(train(cfgs[1], fixed), many[1])
    assert _same_run(train(BASE, fresh, batches=lambda k: prompts), many[2])
    assert many[3].batched_runs == 1 and (tmp_path / "ck.pt").exists()      # a checkpointed run: train()
    assert _same_run(train(BASE, TrainConfig(**{**ck.to_dict(), "checkpoint": None})), many[3])


def test_runs_of_other_shapes_go_to_other_programs():
    cfgs = [BASE, BASE.replace(L=9), BASE.replace(init_scale=0.3), BASE.replace(heads=3)]
    tcfgs = [TrainConfig(lr=0.05, time=0.3, batch=16, records=2)] * 3 + [TrainConfig(lr=0.05, time=0.3, batch=8)]
    many = train_many(cfgs, tcfgs)
    assert [m.batched_runs for m in many] == [2, 1, 2, 1]
    for c, t, m in zip(cfgs, tcfgs, many):
        assert _same_run(train(c, t), m)
    assert [m.batched_runs for m in train_many(cfgs[:1] + cfgs[2:3], tcfgs[:2], max_runs=1)] == [1, 1]


def test_stacked_readout_is_the_model_readout():
    """StackedAttention.losses on S streams with k runs each equals mse_loss of each run's
    MultiHeadAttention on its stream's batch, and so do the gradients."""
    cfgs = [BASE.replace(init="random_full", init_seed=s, init_scale=0.7, logit_scale=1.0 + s) for s in range(6)]
    models = [MultiHeadAttention(c) for c in cfgs]
    stack = StackedAttention.from_models(models)
    batches = [sample_prompts(BASE, 16, make_generator(s, "cpu")) for s in range(3)]
    ctx = torch.stack([b.context for b in batches])
    qry, tgt = torch.stack([b.query for b in batches]), torch.stack([b.target for b in batches])
    losses = stack.losses(Prompts(ctx, qry, tgt), k=2)            # runs 2s, 2s+1 read stream s
    grads = torch.autograd.grad(losses.sum(), [stack.params[n] for n in stack.names])
    for r, m in enumerate(models):
        b = batches[r // 2]
        loss = mse_loss(m(b.context, b.query), b.target)
        assert math.isclose(float(loss.detach()), float(losses[r].detach()), rel_tol=RTOL)
        for g_stack, g in zip(grads, torch.autograd.grad(loss, list(m.parameters()))):
            assert _close(g_stack[r], g)
    # the check sees a run reading another stream's batch
    with torch.no_grad():
        wrong = float(mse_loss(models[0](batches[1].context, batches[1].query), batches[1].target))
    assert not math.isclose(wrong, float(losses[0].detach()), rel_tol=RTOL)


def test_stacked_prompt_losses_are_the_models_held_out_losses():
    """StackedAttention.prompt_losses on one batch is numerics.evaluate.prompt_losses of each
    run's model, and held_out_prompt_losses stacked (models of two shapes, stacks of 16 heads, n
    not a multiple of the chunk) is held_out_prompt_losses model by model, to float rounding; the
    check sees models evaluated on another held-out stream."""
    from numerics.evaluate import held_out_prompt_losses, prompt_losses
    models = [MultiHeadAttention(BASE.replace(init="random_full", init_seed=s, init_scale=0.7, logit_scale=1.0 + s,
                                              heads=2 + s % 2)) for s in range(5)]
    b = sample_prompts(BASE, 32, make_generator(0, "cpu"))
    same = [m for m in models if m.cfg.heads == 2]
    stacked = StackedAttention.from_models(same).prompt_losses(b).detach()
    for r, m in enumerate(same):
        assert _close(stacked[r], prompt_losses(m, b).detach())
    ours, theirs = held_out_prompt_losses(models, 4100, 3, stack_heads=16), held_out_prompt_losses(models, 4100, 3)
    assert np.allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert not np.allclose(ours, held_out_prompt_losses(models, 4100, 4), rtol=1e-5, atol=1e-6)


def test_records_without_readouts_keep_the_loss_curve_and_the_end():
    """train_many(read_records=False): the records before the last hold the loss alone (omega, mu,
    residual None), the losses and the final readout are those of the run read at every record."""
    cfgs = [BASE.replace(init="random_full", init_seed=s, init_scale=0.5) for s in range(2)]
    tc = TrainConfig(lr=0.05, time=1.0, batch=16, records=5, seed=3)
    full, lean = train_many(cfgs, tc), train_many(cfgs, tc, read_records=False)
    for a, b in zip(full, lean):
        assert [r.loss for r in a.trajectory] == [r.loss for r in b.trajectory]
        assert all(r.omega is None and r.mu is None for r in b.trajectory[:-1])
        assert a.trajectory[0].omega is not None
        assert np.array_equal(a.omega, b.omega) and np.array_equal(a.mu, b.mu)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(cfgs=[BASE, BASE], tcfgs=[TrainConfig()] * 3), ValueError, "same length"),
    (dict(cfgs=[BASE], tcfgs=[TrainConfig()], start=[MultiHeadAttention(BASE.replace(L=9))]), ValueError,
     "different ProblemConfig"),
    (dict(cfgs=[BASE], tcfgs=[TrainConfig()], on_record=[3]), TypeError, "must be callable"),
    (dict(cfgs=[BASE, BASE], tcfgs=[TrainConfig()], batches=[None]), ValueError, "one entry per run"),
])
def test_bad_input_is_refused_before_training(kwargs, error, message):
    with pytest.raises(error, match=message):
        train_many(**kwargs)


def test_a_start_given_twice_is_refused():
    m = MultiHeadAttention(BASE)
    with pytest.raises(ValueError, match="appears twice"):
        train_many([BASE, BASE], TrainConfig(time=0.1), start=[m, m])


def test_the_race_grid_of_boundary_allocation_race_as_one_program():
    """A real experiment's run set: the race cells of boundary-allocation-race's quick profile
    (16 starts x 8 data seeds, built as claims.boundary_allocation_race.race_grid builds them), cut to
    10 steps: eight streams, 16 runs each, in one program; every run of streams 0 and 1 is the
    run alone (the other streams' runs are the same program's rows)."""
    import dataclasses

    from claims.boundary_allocation_race import RACE_PROFILES
    from numerics.experiments.starts import train_config as race_tcfg
    from theory.initialisation import race_starts

    p = dataclasses.replace(RACE_PROFILES["quick"], time=10 * RACE_PROFILES["quick"].lr, records=3)
    base = ProblemConfig(tasks=p.tasks, heads=p.heads, L=p.L, sigma=p.sigma)
    cfgs, tcfgs = [], []
    for st in race_starts(p.s0, p.ratios, p.heads, base.m):
        cfg = base.replace(init="given", init_omega=tuple(map(tuple, st["omega0"])), init_mu=tuple(map(tuple, st["mu0"])))
        for k in p.data_seeds:
            cfgs.append(cfg)
            tcfgs.append(race_tcfg(p, k))
    many = train_many(cfgs, tcfgs)
    n = 16 * len(p.data_seeds)
    assert len(p.data_seeds) == 8 and len(many) == n and all(m.batched_runs == n for m in many)
    for c, t, m in zip(cfgs, tcfgs, many):
        if t.seed in (0, 1):
            assert _same_run(train(c, t), m)


def test_large_streams_get_programs_of_their_own_on_the_cpu():
    """Above MERGE_CONTEXT_ELEMENTS (here 60000 x 8 x 5 = 2.4 M > 2^20) two streams are two
    programs, each keeping its own runs together; small streams share one."""
    from numerics.engine import MERGE_CONTEXT_ELEMENTS
    big = 60000
    assert big * BASE.L * BASE.token_dim > MERGE_CONTEXT_ELEMENTS
    cfgs = [BASE, BASE.replace(init_scale=0.3)] * 2
    tcfgs = [TrainConfig(lr=0.05, time=0.05, batch=big, records=2, seed=s) for s in (0, 0, 1, 1)]
    assert [m.batched_runs for m in train_many(cfgs, tcfgs)] == [2, 2, 2, 2]
    small = [TrainConfig(lr=0.05, time=0.05, batch=16, records=2, seed=s) for s in (0, 0, 1, 1)]
    assert [m.batched_runs for m in train_many(cfgs, small)] == [4, 4, 4, 4]


def test_a_batch_source_changed_in_place_is_read_again():
    """A source that returns the same Prompts object with new numbers (written in place) is
    copied again; one that returns a fresh object each step is too."""
    buf = sample_prompts(BASE, 16, make_generator(0, "cpu"))
    gen = make_generator(3, "cpu")

    def in_place(step):              # the very same object every step, refilled in place
        if step:
            sample_prompts(BASE, 16, gen, out=buf)
        return buf

    fresh_gen = make_generator(3, "cpu")
    tcfg = TrainConfig(lr=0.05, time=0.4, batch=16, records=2)
    alone = train(BASE, tcfg, batches=lambda k: sample_prompts(BASE, 16, fresh_gen) if k else
                  sample_prompts(BASE, 16, make_generator(0, "cpu")))
    many = train_many([BASE, BASE.replace(init_scale=0.3)], tcfg, batches=[in_place, None])
    assert _same_run(alone, many[0])


def test_a_start_model_holds_the_weights_where_its_run_stopped():
    """As with train(): a start model trained in place holds the weights at the record where
    its hook stopped the run (or at its end)."""
    class Stop(Exception):
        pass

    def stop_at_4(step, t, model, loss):
        if step == 4:
            raise Stop

    tcfg = TrainConfig(lr=0.05, time=0.5, batch=16, records=2)
    alone = MultiHeadAttention(BASE)
    with pytest.raises(Stop):
        train(BASE, tcfg, start=alone, on_record=stop_at_4, record_every=2)
    starts = [MultiHeadAttention(BASE), MultiHeadAttention(BASE.replace(init_scale=0.3))]
    many = train_many([BASE, BASE.replace(init_scale=0.3)], tcfg, start=starts, on_record=[stop_at_4, None],
                      record_every=[2, None])
    assert isinstance(many[0], Stop) and many[1].final_model is starts[1]
    assert all(_close(a.detach(), b.detach()) for a, b in zip(alone.parameters(), starts[0].parameters()))
    assert not _close(MultiHeadAttention(BASE).K.detach(), starts[0].K.detach())     # it did train


# --- run fingerprints: independence as a checked fact ---------------------------------------------

def test_a_fingerprint_is_the_first_batch_and_the_initial_weights():
    """A run's fingerprint digests its first batch and its initial weights, whether it is trained
    alone or in a program; the parts are of the run's own draw and init."""
    from numerics.engine import digest
    cfg = BASE.replace(init="random_full", init_seed=4)
    tcfg = TrainConfig(lr=0.05, time=0.2, batch=16, records=2, seed=3)
    alone = train(cfg, tcfg)
    first = sample_prompts(cfg, 16, make_generator(3, "cpu"))
    assert alone.fingerprint["prompts"] == digest(first.context, first.query, first.target)
    assert alone.fingerprint["weights"] == digest(*(p.detach() for p in MultiHeadAttention(cfg).parameters()))
    many = train_many([BASE, cfg], [TrainConfig(lr=0.05, time=0.2, batch=16, records=2, seed=1), tcfg])
    assert many[1].fingerprint == alone.fingerprint and many[0].fingerprint != alone.fingerprint
    assert alone.to_dict()["fingerprint"] == alone.fingerprint


def test_runs_made_to_share_one_stream_and_one_init_are_caught(monkeypatch):
    """Four runs of their own seeds and random starts pass check_independent; the same call with
    the program made to give every run the first run's seed and init_seed fails it, both on the
    prompts and (runs that share a stream on purpose) on the weights."""
    import dataclasses

    import numerics.train as T
    from numerics.engine import case_seed, check_independent

    cfgs = [BASE.replace(init="random_full", init_seed=case_seed(0, "init", k)) for k in range(4)]
    tcfgs = [TrainConfig(lr=0.05, time=0.2, batch=16, records=2, seed=case_seed(0, "data", k)) for k in range(4)]
    runs = train_many(cfgs, tcfgs)
    fps = {f"run {k}": r.fingerprint for k, r in enumerate(runs)}
    check_independent(fps, "four replicates")
    check_independent(fps, "four replicates", shared_stream=True)
    real = T._program_runs

    def one_stream_one_init(part, cfgs, tcfgs, seams, estimator):
        cfgs = [c.replace(init_seed=cfgs[part[0]].init_seed) for c in cfgs]
        tcfgs = [dataclasses.replace(t, seed=tcfgs[part[0]].seed) for t in tcfgs]
        return real(part, cfgs, tcfgs, seams, estimator)

    monkeypatch.setattr(T, "_program_runs", one_stream_one_init)
    shared = train_many(cfgs, tcfgs)
    assert all(r.batched_runs == 4 for r in shared)
    fps = {f"run {k}": r.fingerprint for k, r in enumerate(shared)}
    with pytest.raises(ValueError, match=r"four replicates: .*first batch of prompts \('run 0', 'run 1', 'run 2', 'run 3'\)"):
        check_independent(fps, "four replicates")
    with pytest.raises(ValueError, match=r"initial weights \('run 0', 'run 1', 'run 2', 'run 3'\)"):
        check_independent(fps, "four replicates", shared_stream=True)


def test_the_deferred_divergence_check_of_a_gpu_names_the_same_step(monkeypatch, tmp_path):
    """On a GPU the losses are checked every 50 steps (and at records, last steps and before a
    checkpoint) rather than every step; forced to every 7th here on the CPU: the same error
    for the diverging run, the same numbers for the others, and a checkpointed run the same."""
    from numerics.train import Program
    cfgs = [BASE, BASE.replace(init_scale=3.0), BASE.replace(init_scale=0.3)]
    tcfgs = [TrainConfig(lr=0.05, time=1.0, batch=16, records=3), TrainConfig(lr=50.0, time=500.0, batch=16, records=2),
             TrainConfig(lr=0.05, time=0.5, batch=16, records=4, seed=1)]
    every_step = train_many(cfgs, tcfgs)
    ck = TrainConfig(lr=0.05, time=1.0, batch=16, records=3, checkpoint=str(tmp_path / "ck.pt"), checkpoint_every=4)
    real_init = Program.__init__

    def every_7th(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        self.check_every = 7

    monkeypatch.setattr(Program, "__init__", every_7th)
    deferred = train_many(cfgs, tcfgs)
    assert isinstance(deferred[1], TrainingDiverged) and str(deferred[1]) == str(every_step[1])
    assert _same_run(every_step[0], deferred[0]) and _same_run(every_step[2], deferred[2])
    assert _same_run(every_step[0], train(BASE, ck)) and (tmp_path / "ck.pt").exists()
