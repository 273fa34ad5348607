"""The local search over options: the change it takes is the best of every option it could try, and
the options it tries are those no other option of the table dominates."""

from __future__ import annotations

import numpy as np
import pytest

from rec.search.assignment import usage
from rec.search.space import SearchSpace
from rec.search.switch import distinct_options, option_changes, place_option, switch_options
from rec.tolerance import lowers
from tests.rec.search_instances import random_space


def random_assignment(space: SearchSpace, seed: int) -> object:
    """Each table on a random feasible option, placed greedily: a plan with room to improve."""
    rng = np.random.default_rng(seed)
    for _ in range(20):  # a tight instance may need a few draws for the tables to fit
        a = _drawn(space, rng)
        if a is not None:
            return a
    raise AssertionError("no random plan fits")


def _drawn(space: SearchSpace, rng: np.random.Generator) -> object:
    opts = space.options
    choice = np.zeros(space.num_tables, np.int64)
    shard_rank = np.full(len(opts.perf), -1, np.int64)
    base = (np.zeros(space.world_size), np.zeros(space.world_size, np.int64), np.zeros(space.world_size, np.int64))
    for t in range(space.num_tables):
        mine = np.flatnonzero((opts.table == t) & space.feasible)
        for o in rng.permutation(mine):
            placed = place_option(space, base, int(o))
            if placed is not None:
                break
        else:
            return None
        choice[t] = o
        shard_rank[opts.shards(int(o))] = placed.first
        base = (placed.loads, placed.hbm, placed.ddr)
    return usage(space, choice, shard_rank)


@pytest.mark.parametrize("seed", range(24))
def test_a_step_takes_the_change_that_lowers_the_busiest_rank_most_of_every_option_tried(seed):
    space = random_space(seed)
    a = random_assignment(space, seed)
    cp = a.critical_path
    rank = int(np.argmax(a.loads))
    peaks = [float(p.loads.max()) for _, _, p in option_changes(space, a, rank, distinct_options(space))]
    stepped = a.copy()
    switch_options(space, stepped, max_steps=1)
    if peaks and lowers(min(peaks), cp):
        assert stepped.critical_path == min(peaks)
    else:
        assert stepped.critical_path == cp and (stepped.choice == a.choice).all()


@pytest.mark.parametrize("seed", range(12))
def test_the_options_tried_are_exactly_those_no_other_option_of_the_table_dominates(seed):
    space = random_space(seed)
    opts = space.options
    hbm, ddr = opts.total(opts.hbm), opts.total(opts.ddr)
    kept = distinct_options(space)

    def dominates(p: int, o: int) -> bool:
        mine = (space.work[p], space.max_shard[p], hbm[p], ddr[p])
        theirs = (space.work[o], space.max_shard[o], hbm[o], ddr[o])
        return (p != o and space.placement[p] == space.placement[o]
                and all(x <= y for x, y in zip(mine, theirs, strict=True)) and (mine, p) < (theirs, o))

    for t in range(space.num_tables):
        feasible = np.flatnonzero((opts.table == t) & space.feasible).tolist()
        expected = [o for o in feasible if not any(dominates(p, o) for p in feasible)]
        assert list(kept.get(t, ())) == expected


@pytest.mark.parametrize("seed", range(24))
def test_a_placed_option_adds_exactly_its_shards_usage_on_the_ranks_it_names(seed):
    """Every option placed on a random plan, with the shapes a local search keeps across its steps:
    the loads and memory are the plan's plus the option's shards at the ranks the placement names
    (to the last bit where the shards' ranks are fixed by the option, as ``usage`` sums them; shards
    placed one by one add one by one), and within every rank's memory."""
    from rec.search.placement import Placement
    from rec.search.space import add_runs
    from rec.search.switch import Shapes

    fixed = (Placement.EVERY_RANK, Placement.HOST_UNIFORM)

    space = random_space(seed)
    opts = space.options
    a = random_assignment(space, seed)
    shapes = Shapes(space)
    for o in np.flatnonzero(space.feasible):
        for _ in range(2):  # the second placement reads the kept shape
            placed = place_option(space, (a.loads, a.hbm, a.ddr), int(o), shapes)
            if placed is None:
                continue
            entries = opts.shards(int(o))
            rep = opts.repeat[entries].astype(np.int64)
            first = placed.first.astype(np.int64)
            expected = a.loads + add_runs(space, opts.perf[entries], first, rep)
            if space.placement[o] in fixed:
                assert (placed.loads == expected).all()
            else:
                assert placed.loads == pytest.approx(expected, rel=1e-12, abs=1e-12)
            assert (placed.hbm == a.hbm + np.rint(add_runs(space, opts.hbm[entries].astype(float), first, rep))).all()
            assert (placed.ddr == a.ddr + np.rint(add_runs(space, opts.ddr[entries].astype(float), first, rep))).all()
            assert (placed.hbm <= space.hbm_cap).all() and (placed.ddr <= space.ddr_cap).all()
