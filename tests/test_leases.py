"""Server bookkeeping: the lease book (the element pool: test_pool.py)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from snet.protocol.errors import RejectedUpdate
from snet.server.leases import LeaseBook, LeaseRecord

TOTAL = 120
TRAIN = np.setdiff1d(np.arange(TOTAL), np.arange(0, TOTAL, 7))  # a train/cv-like subset


def new_book(chunk: int = 10, seed: int = 3) -> LeaseBook:
    return LeaseBook(train_frames=TRAIN, total_frames=TOTAL, chunk_frames=chunk, seed=seed)


def deliver(book: LeaseBook, lease: LeaseRecord, bunch: int) -> list[np.ndarray]:
    """Accept and apply the rest of a lease in bunches, as the server does."""
    covered = []
    while lease.remaining:
        patterns = min(bunch, lease.remaining)
        frames = book.accept(lease.worker_id, lease.lease_id, lease.received, patterns)
        book.record_applied(frames)
        covered.append(frames)
    return covered


def assert_every_frame_once(book: LeaseBook) -> None:
    summary = book.ledger.summary()
    assert summary["frames"] == len(TRAIN)
    assert summary["used_once"] == len(TRAIN)
    assert summary["used_more"] == 0
    assert summary["unused"] == 0
    # frames outside the training set are never touched
    outside = np.setdiff1d(np.arange(TOTAL), TRAIN)
    assert not book.ledger.uses[outside].any()


# ---------------------------------------------------------------- LeaseBook


def test_full_epoch_uses_every_frame_once() -> None:
    book = new_book(chunk=10)
    assert not book.epoch_complete  # no epoch started yet
    book.start_epoch(0)
    assert book.waiting_chunks == int(np.ceil(len(TRAIN) / 10))
    assert book.ledger.summary()["chunks"] == book.waiting_chunks
    seen: list[np.ndarray] = []
    worker = 0
    while (lease := book.grant(worker % 3)) is not None:
        assert lease.epoch == 0
        assert not book.epoch_complete
        for frames in deliver(book, lease, bunch=4):
            seen.append(frames)
        worker += 1
    assert book.leases_out == 0
    assert book.epoch_complete
    everything = np.concatenate(seen)
    np.testing.assert_array_equal(np.sort(everything), TRAIN)
    assert book.accepted_frames == book.applied_frames == len(TRAIN)
    assert_every_frame_once(book)
    assert book.ledger.summary()["requeued_frames"] == 0


def test_epochs_are_shuffled_differently_and_reproducibly() -> None:
    a, b = new_book(), new_book()
    a.start_epoch(0)
    b.start_epoch(0)
    first_a = a.grant(1)
    first_b = b.grant(1)
    assert first_a is not None and first_b is not None
    np.testing.assert_array_equal(first_a.indices, first_b.indices)
    a.start_epoch(1)
    second = a.grant(1)
    assert second is not None
    assert not np.array_equal(second.indices, first_a.indices)
    assert a.ledger.epoch == 1 and not a.ledger.uses.any()  # one array, counted anew


def test_lease_ids_are_unique() -> None:
    book = new_book()
    book.start_epoch(0)
    ids = []
    while (lease := book.grant(1)) is not None:
        ids.append(lease.lease_id)
    assert len(set(ids)) == len(ids)
    assert book.grant(2) is None


def test_worker_gone_requeues_exactly_the_undelivered_remainder() -> None:
    book = new_book(chunk=10)
    book.start_epoch(0)
    lease_a = book.grant(1)
    lease_b = book.grant(1)
    other = book.grant(2)
    assert lease_a is not None and lease_b is not None and other is not None
    delivered = book.accept(1, lease_a.lease_id, 0, 3)
    book.record_applied(delivered)
    undelivered_a = lease_a.indices[3:].copy()
    undelivered_b = lease_b.indices.copy()
    assert book.remaining_frames(1) == 7 + 10
    waiting = book.waiting_chunks
    assert book.worker_gone(1) == 17
    assert book.remaining_frames(1) == 0
    assert book.held_by(1) == []
    assert book.waiting_chunks == waiting + 2
    assert book.ledger.requeued_frames == 17
    # the returned frames are the next ones granted, to whoever asks
    regranted = [book.grant(3), book.grant(3)]
    assert all(lease is not None for lease in regranted)
    got = np.concatenate([lease.indices for lease in regranted if lease is not None])
    np.testing.assert_array_equal(
        np.sort(got), np.sort(np.concatenate([undelivered_a, undelivered_b]))
    )
    # the gone (or late: server/lateness.py) worker's leases are no longer accepted, and
    # an update on one is refused in the words protocol/README.md section 8.3 gives
    assert not book.is_repeat(1, lease_a.lease_id, 3)  # refused, not silently ignored
    with pytest.raises(RejectedUpdate, match=f"^lease {lease_a.lease_id} is not held by this"):
        book.accept(1, lease_a.lease_id, 3, 1)
    # everyone else finishes the epoch: still every frame exactly once
    for lease in regranted:
        assert lease is not None
        deliver(book, lease, bunch=3)
    deliver(book, other, bunch=5)
    while (lease := book.grant(4)) is not None:
        deliver(book, lease, bunch=6)
    assert book.epoch_complete
    assert_every_frame_once(book)


def test_worker_gone_without_leases() -> None:
    book = new_book()
    book.start_epoch(0)
    assert book.worker_gone(9) == 0
    assert book.ledger.requeued_frames == 0


def test_skip_requeues_refused_frames() -> None:
    book = new_book(chunk=10)
    book.start_epoch(0)
    lease = book.grant(1)
    assert lease is not None
    book.record_applied(book.accept(1, lease.lease_id, 0, 4))
    refused = lease.indices[4:7].copy()
    book.skip(1, lease.lease_id, 4, 3)
    assert lease.received == 7  # the lease moves on
    assert book.accepted_frames == 4  # the refused frames are not counted as delivered
    assert book.ledger.requeued_frames == 3
    assert book.ledger.uses[refused].sum() == 0
    book.record_applied(book.accept(1, lease.lease_id, 7, 3))  # finishes the lease
    assert book.leases_out == 0
    again = book.grant(2)
    assert again is not None
    np.testing.assert_array_equal(again.indices, refused)
    deliver(book, again, bunch=2)
    while (more := book.grant(1)) is not None:
        deliver(book, more, bunch=4)
    assert book.epoch_complete
    assert_every_frame_once(book)


def test_skip_of_the_last_frames_closes_the_lease() -> None:
    book = new_book(chunk=10)
    book.start_epoch(0)
    lease = book.grant(1)
    assert lease is not None
    book.skip(1, lease.lease_id, 0, 10)
    assert book.leases_out == 0
    assert book.remaining_frames(1) == 0
    regranted = book.grant(1)
    assert regranted is not None
    np.testing.assert_array_equal(regranted.indices, lease.indices)


@pytest.mark.parametrize(
    ("worker", "offset", "patterns"),
    [
        (1, 1, 2),  # skips a frame
        (1, 0, 0),  # no patterns
        (1, 0, 11),  # past the end of the lease
        (1, -1, 2),
        (2, 0, 2),  # someone else's lease
    ],
    ids=["gap", "empty", "past-end", "negative", "foreign"],
)
def test_accept_rejects_bad_claims(worker: int, offset: int, patterns: int) -> None:
    book = new_book(chunk=10)
    book.start_epoch(0)
    lease = book.grant(1)
    assert lease is not None
    with pytest.raises(RejectedUpdate):
        book.accept(worker, lease.lease_id, offset, patterns)
    # nothing changed: the right update still goes through
    assert lease.received == 0
    assert book.accepted_frames == 0
    np.testing.assert_array_equal(book.accept(1, lease.lease_id, 0, 2), lease.indices[:2])


def test_accept_rejects_repeated_and_unknown_leases() -> None:
    book = new_book(chunk=10)
    book.start_epoch(0)
    lease = book.grant(1)
    assert lease is not None
    book.accept(1, lease.lease_id, 0, 5)
    with pytest.raises(RejectedUpdate, match="next expected offset is 5"):
        book.accept(1, lease.lease_id, 0, 5)  # a duplicate
    with pytest.raises(RejectedUpdate):
        book.accept(1, 999, 0, 1)
    book.accept(1, lease.lease_id, 5, 5)
    with pytest.raises(RejectedUpdate):  # finished leases are forgotten
        book.accept(1, lease.lease_id, 10, 1)


def test_lost_updates_are_found_by_the_next_one_and_requeued() -> None:
    book = new_book(chunk=10)
    book.start_epoch(0)
    first, second = book.grant(1), book.grant(1)
    other = book.grant(2)
    assert first is not None and second is not None and other is not None
    book.record_applied(book.accept(1, first.lease_id, 0, 3))
    # the update covering 3:6 was lost; the one on 6:9 shows it
    assert book.lost_before(1, first.lease_id, 6, 3) == (3, 1)
    book.record_applied(book.accept(1, first.lease_id, 6, 3))
    # the update on 9:10 was lost too; the next one is on the second lease
    assert book.lost_before(1, second.lease_id, 0, 3) == (1, 1)
    assert first.lease_id not in {lease.lease_id for lease in book.held_by(1)}
    assert book.lost_before(1, second.lease_id, 0, 3) == (0, 0)  # nothing more is missing
    assert book.lost_before(2, second.lease_id, 4, 3) == (0, 0)  # not its lease
    assert book.lost_before(1, second.lease_id, 11, 3) == (0, 0)  # past the lease's end
    book.record_applied(book.accept(1, second.lease_id, 0, 2))
    # two updates of 3 lost (2:5, 5:8): counted in its largest update, 3 frames
    assert book.lost_before(1, second.lease_id, 8, 2) == (6, 2)
    assert book.ledger.requeued_frames == 10
    book.record_applied(book.accept(1, second.lease_id, 8, 2))
    deliver(book, other, 4)
    while (lease := book.grant(3)) is not None:
        deliver(book, lease, 5)
    assert book.epoch_complete
    assert_every_frame_once(book)


def test_an_update_delivered_twice_is_known_as_a_repeat() -> None:
    book = new_book(chunk=10)
    book.start_epoch(0)
    lease = book.grant(1)
    assert lease is not None
    assert not book.is_repeat(1, lease.lease_id, 0)
    book.accept(1, lease.lease_id, 0, 4)
    assert book.is_repeat(1, lease.lease_id, 0)  # covered already
    assert not book.is_repeat(1, lease.lease_id, 4)  # the next one
    assert not book.is_repeat(2, lease.lease_id, 0)  # not its lease
    book.accept(1, lease.lease_id, 4, 6)  # used up: the lease is gone from the book
    assert book.is_repeat(1, lease.lease_id, 4)
    assert not book.is_repeat(2, lease.lease_id, 4)
    assert not book.is_repeat(1, lease.lease_id + 1, 0)  # never granted
    # a negative offset covers no frames: a bad claim to refuse, not a delivery to ignore
    assert not book.is_repeat(1, lease.lease_id, -1)


def test_a_negative_offset_on_a_held_lease_is_not_a_repeat() -> None:
    book = new_book(chunk=10)
    book.start_epoch(0)
    lease = book.grant(1)
    assert lease is not None
    book.accept(1, lease.lease_id, 0, 4)
    assert not book.is_repeat(1, lease.lease_id, -5)
    assert not book.is_repeat(1, lease.lease_id, -(2**63))
    with pytest.raises(RejectedUpdate, match="update covers -5:-1"):
        book.accept(1, lease.lease_id, -5, 4)


def test_a_negative_offset_shows_no_update_lost() -> None:
    """An update at a negative offset on a later lease is a bad claim, refused: it showed
    the worker's earlier lease as trained and its updates lost, and took it back."""
    book = new_book(chunk=10)
    book.start_epoch(0)
    first, second = book.grant(1), book.grant(1)
    assert first is not None and second is not None
    assert book.lost_before(1, second.lease_id, -1, 3) == (0, 0)
    assert first.lease_id in {lease.lease_id for lease in book.held_by(1)}


def test_epoch_complete_waits_for_application() -> None:
    book = new_book(chunk=1000)  # a single chunk
    book.start_epoch(0)
    assert not book.epoch_complete  # a chunk is waiting
    lease = book.grant(1)
    assert lease is not None
    assert book.waiting_chunks == 0
    assert not book.epoch_complete  # a lease is out
    frames = book.accept(1, lease.lease_id, 0, len(TRAIN))
    assert book.leases_out == 0
    assert not book.epoch_complete  # delivered but not yet applied
    book.record_applied(frames)
    assert book.epoch_complete
    book.start_epoch(1)
    assert not book.epoch_complete
    assert book.accepted_frames == book.applied_frames == 0


def test_epoch_complete_after_worker_gone_needs_the_requeued_frames() -> None:
    book = new_book(chunk=1000)
    book.start_epoch(0)
    lease = book.grant(1)
    assert lease is not None
    book.record_applied(book.accept(1, lease.lease_id, 0, 50))
    book.worker_gone(1)
    assert not book.epoch_complete
    rest = book.grant(2)
    assert rest is not None
    assert len(rest.indices) == len(TRAIN) - 50
    deliver(book, rest, bunch=16)
    assert book.epoch_complete
    assert_every_frame_once(book)


def test_the_next_epochs_shuffle_computed_ahead_is_the_same_shuffle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Large data: the next epoch's permutation is computed in a thread while this one
    trains; the chunks are those computed on the spot, epoch by epoch and on a restore."""
    from snet.server import epoch_chunks
    from snet.server.epoch_chunks import EpochChunks

    frames = np.arange(3, 5003)
    spot = [EpochChunks(frames, 7, 300).of_epoch(epoch) for epoch in range(4)]  # small: inline
    monkeypatch.setattr(epoch_chunks, "SHUFFLE_AHEAD_FROM", 1000)
    threads: list[str] = []
    permutation = EpochChunks._permutation

    def noted(self: EpochChunks, epoch: int) -> np.ndarray:
        threads.append(threading.current_thread().name)
        return permutation(self, epoch)

    monkeypatch.setattr(EpochChunks, "_permutation", noted)
    ahead = EpochChunks(frames, 7, 300)
    for epoch in range(4):
        got = ahead.of_epoch(epoch)
        assert [c.tolist() for c in got] == [c.tolist() for c in spot[epoch]]
    pending = ahead._ahead  # epoch 4's, started with epoch 3's chunks
    assert pending is not None and pending[0] == 4
    pending[1].result(timeout=30)
    assert threads[0] == threading.current_thread().name  # the first: nothing was ahead
    assert threads[1:] == ["snet-epoch-order"] * 4  # epochs 1-3 taken, 4 waiting
    # a restored book rebuilds the epoch it is in: not the one computed ahead
    assert [c.tolist() for c in ahead.of_epoch(2)] == [c.tolist() for c in spot[2]]
    last = EpochChunks(frames, 7, 300, epochs=2)  # epochs 0 and 1: 1 has no next
    assert [c.tolist() for c in last.of_epoch(1)] == [c.tolist() for c in spot[1]]
    assert last._ahead is None
    sequential = EpochChunks(frames[::-1].copy(), 7, 300, sequential=True).of_epoch(1)
    assert sorted(int(c[0]) for c in sequential) == list(range(3, 5003, 300))

    # no thread to be had: the next epoch's order is computed when it starts, the same
    def no_thread(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    alone = EpochChunks(frames, 7, 300)
    assert [c.tolist() for c in alone.of_epoch(1)] == [c.tolist() for c in spot[1]]
    assert alone._ahead is None
    assert [c.tolist() for c in alone.of_epoch(2)] == [c.tolist() for c in spot[2]]
