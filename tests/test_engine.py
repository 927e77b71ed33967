"""numerics.engine: needs as data, computed once, seeded by identity, priced before they run."""
from __future__ import annotations

import pytest

from numerics import engine
from numerics.engine import Engine, Failed, closure, kind, need
from numerics.engine import case_seed

CALLS: list = []


@kind("test-square", cost=lambda x: 2.0)
def _square(x, seed):
    CALLS.append(("square", x, seed))
    if x < 0:
        raise ValueError("negative")
    return x * x


@kind("test-plus", cost=lambda x, base: 1.0)
def _plus(x, base, seed):
    CALLS.append(("plus", x, base))
    return x + base


def _many(params, seeds):
    CALLS.append(("many", len(params)))
    return [p["x"] * 10 for p in params]


@kind("test-batched", cost=lambda x, shape: 1.0, batch_key=lambda x, shape: shape, run_many=_many)
def _batched(x, shape, seed):
    return x * 10


@pytest.fixture(autouse=True)
def fresh():
    engine.clear_memo()
    CALLS.clear()


def test_a_need_is_its_kind_and_parameters():
    a, b = need("test-square", x=2), need("test-square", x=2.0)
    assert a.identity == b.identity          # 2 and 2.0 name the same need, as case_seed does
    assert need("test-square", x=3).identity != a.identity
    assert a.seed(0) == case_seed(0, "test-square", a.identity) and a.seed(1) != a.seed(0)
    assert need("test-square", x=2, stream=("s", 1)).seed(5) == case_seed(5, "s", 1)


def test_each_need_is_computed_once_and_dependencies_first():
    dep = need("test-square", x=3)
    out = Engine(seed=0).run([need("test-plus", x=1, base=dep), dep, need("test-plus", x=2, base=dep)])
    assert [c for c in CALLS if c[0] == "square"] == [("square", 3, dep.seed(0))]
    assert out[need("test-plus", x=1, base=dep)] == 10 and out[dep] == 9
    assert closure([need("test-plus", x=1, base=dep)])[0] == dep
    both = Engine(seed=0).run([need("test-plus", x=(dep, need("test-square", x=2)), base=())])
    assert both[need("test-plus", x=(dep, need("test-square", x=2)), base=())] == (9, 4)   # a tuple of needs
    Engine(seed=0).run([dep])                                    # kept for the process: not computed again
    assert len([c for c in CALLS if c[0] == "square"]) == 2              # x = 3 once, and x = 2
    Engine(seed=1).run([dep])                                    # another report seed: another value
    assert [c for c in CALLS if c[0] == "square"][-1] == ("square", 3, dep.seed(1))


def test_a_failed_need_fails_only_its_readers():
    bad, good = need("test-square", x=-1), need("test-square", x=2)
    out = Engine(seed=0).run([bad, good, need("test-plus", x=1, base=bad)])
    assert out[good] == 4
    assert isinstance(dict.__getitem__(out, bad), Failed)
    with pytest.raises(ValueError, match="negative"):
        out[bad]
    with pytest.raises(ValueError, match="negative"):
        out[need("test-plus", x=1, base=bad)]


def test_needs_of_one_batch_key_run_as_one_program():
    needs = [need("test-batched", x=i, shape="a") for i in range(3)] + [need("test-batched", x=5, shape="b")]
    out = Engine(seed=0).run(needs)
    assert [out[n] for n in needs] == [0, 10, 20, 50]
    assert sorted(c for c in CALLS if c[0] == "many") == [("many", 3)]     # shape b alone: its own run


def test_the_price_is_of_what_is_not_yet_computed():
    e = Engine(seed=0)
    dep = need("test-square", x=3)
    assert sum(e.price([need("test-plus", x=1, base=dep)]).values()) == 3.0
    e.run([dep])
    assert sum(e.price([need("test-plus", x=1, base=dep)]).values()) == 1.0
    assert not CALLS[1:], CALLS      # pricing computes nothing


def test_parallel_workers_give_the_values_of_one_process():
    """Two worker processes compute theory values (a registered kind every worker knows): the
    same values as this process; the same workers serve a later run, and close ends them."""
    needs = [need("theory", fn="limit_multi", args=((r, r), 0.0)) for r in (1, 2, 3, 4)]
    serial = Engine(seed=0).run(needs)
    engine.clear_memo()          # else the parallel engine reads the serial one's values
    pooled = Engine(seed=0, jobs=2)
    try:
        pooled.run(needs[:2])
        workers = pooled._pool
        parallel = pooled.run(needs)
        assert workers is not None and pooled._pool is workers
    finally:
        pooled.close()
    assert pooled._pool is None
    assert [parallel[n] for n in needs] == [serial[n] for n in needs]
