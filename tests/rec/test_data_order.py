"""Which rows each rank reads, epoch after epoch: every row of an epoch read once by one rank, the
ranks in step, a resume reading on exactly where an unbroken run would, and a resume on another
number of ranks reading the rest of the epoch without a row twice."""

from __future__ import annotations

import numpy as np
import pytest

from rec.data.order import Piece, Position, ReadOrder, skip


def positions(order: ReadOrder, position: Position, rank: int, rows: int) -> list[int]:
    """The epoch-global positions rank ``rank`` reads from ``position`` on, ``rows`` of them (one epoch at most)."""
    base = position.splits[0][0] if position.splits else position.world_size
    out: list[int] = []
    for piece in skip(order.pieces(position, rank), position.rows):
        for k in range(piece.start // order.window, (piece.stop - 1) // order.window + 1):
            first, offsets = order.window_positions(position.epoch, base, piece.rank, k)
            lo, hi = max(piece.start - k * order.window, 0), min(piece.stop - k * order.window, len(offsets))
            out += [first + int(o) for o in offsets[lo:hi]]
    return out[:rows]


def group_rows(seed: int, groups: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 40, groups).astype(np.int64)


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_every_row_of_an_epoch_is_read_once_and_fewer_than_the_ranks_are_left_out(world, shuffle):
    order = ReadOrder(group_rows(world, 23), seed=5, shuffle=shuffle, window=17)
    share = order.share_rows(Position(world))
    read = [p for r in range(world) for p in positions(order, Position(world), r, share)]
    assert len(read) == len(set(read)) == world * share
    assert order.total - len(read) < world
    assert set(read) <= set(range(order.total))
    if not shuffle:  # in order: each rank a contiguous run of the epoch
        assert positions(order, Position(world), 0, share) == list(range(share))


def test_each_epoch_reads_in_another_order_and_the_same_seed_in_the_same():
    order = ReadOrder(group_rows(1, 30), seed=9, shuffle=True, window=50)
    first = positions(order, Position(2), 0, 100)
    assert first == positions(ReadOrder(order.group_rows, 9, True, 50), Position(2), 0, 100)
    assert first != positions(order, Position(2, epoch=1), 0, 100)
    assert not np.array_equal(order.group_order(0), order.group_order(1))


@pytest.mark.parametrize("done", [0, 1, 16, 17, 100, 1000])
def test_reading_on_from_an_advanced_position_continues_the_unbroken_stream(done):
    order = ReadOrder(group_rows(2, 12), seed=1, shuffle=True, window=16)
    start = Position(3)
    share = order.share_rows(start)
    unbroken = [p for e in range(done // share + 2) for p in positions(order, Position(3, epoch=e), 1, share)]
    later = order.advance(start, done)
    assert later.epoch == done // share and later.rows == done % share
    assert positions(order, later, 1, 20) == unbroken[done:done + 20][: share - later.rows]


@pytest.mark.parametrize(("old", "new"), [(2, 3), (4, 1), (3, 2), (1, 5)])
def test_a_resume_on_another_number_of_ranks_reads_the_rest_of_the_epoch_without_repeating_a_row(old, new):
    order = ReadOrder(group_rows(old * new, 40), seed=3, shuffle=True, window=13)
    before = Position(old)
    done = order.share_rows(before) // 3
    read = [p for r in range(old) for p in positions(order, before, r, done)]
    after = order.advance(before, done).on(new)
    assert after.splits == ((old, done),) and after.rows == 0
    rest = order.share_rows(after)
    later = [p for r in range(new) for p in positions(order, after, r, rest)]
    assert len(set(read + later)) == len(read) + len(later)  # no row twice
    assert old * order.share_rows(before) - len(read) - len(later) < new  # fewer than the new ranks left out
    # the epoch after the re-split is the new world's, from its start
    assert order.advance(after, rest) == Position(new, epoch=1)
    # how much of the epoch is read counts the old ranks' rows (train_metrics.json's epochs once dropped them)
    assert order.epoch_read(order.advance(after, rest // 2)) == pytest.approx(
        (len(read) + new * (rest // 2)) / (old * order.share_rows(before)))


def test_a_resume_in_the_middle_of_a_re_split_epoch_finds_the_same_rows():
    order = ReadOrder(group_rows(7, 25), seed=4, shuffle=True, window=9)
    after = order.advance(Position(2), 50).on(3)
    straight = positions(order, after, 2, 1000)
    again = order.advance(after, 11)
    assert positions(order, again, 2, 1000) == straight[11:]
    twice = again.on(2)  # and once more onto another count
    assert twice.splits == ((2, 50), (3, 11))
    left = [p for r in range(2) for p in positions(order, twice, r, order.share_rows(twice))]
    read_before = {p for r in range(2) for p in positions(order, Position(2), r, 50)}
    read_between = {p for r in range(3) for p in positions(order, after, r, 11)}
    assert not set(left) & (read_before | read_between)


def test_skip_and_pieces_cover_exact_ranges():
    pieces = [Piece(0, 5, 10), Piece(1, 0, 3)]
    assert skip(pieces, 6) == [Piece(1, 1, 3)]
    assert skip(pieces, 0) == pieces
    assert sum(map(len, ReadOrder(np.array([10, 10]), 0, False, 4).pieces(Position(3), 2))) == 6


def test_every_position_a_run_reaches_is_a_place_in_the_order_and_an_edited_one_is_named():
    """A checkpoint's data_position.json is read back: rows or splits beyond a share of the epoch (an
    edited file) once gave '50000001 epochs' or a silently different reading."""
    order = ReadOrder(group_rows(3, 23), seed=5, shuffle=True, window=17)
    share = order.share_rows(Position(2))
    reached = [order.advance(Position(2), rows) for rows in (0, 1, share - 1, share, 5 * share + 3)]
    resplit = order.advance(Position(2), 7).on(3)
    assert all(order.position_problem(p) is None for p in [*reached, resplit, order.advance(resplit, 11)])
    assert "beyond their share" in (order.position_problem(Position(2, 0, share + 1)) or "")
    assert "a split of 2 ranks read" in (order.position_problem(Position(3, 0, 0, ((2, share + 1),))) or "")
