"""Server bookkeeping: the lease book, the update rule and the element pool."""

from __future__ import annotations

import numpy as np
import pytest

from snet.protocol.decoder import FrameDecoder
from snet.protocol.errors import RejectedUpdate
from snet.protocol.framing import ArrayInfo, encode_bytes
from snet.protocol.messages import Update, Weights
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server.leases import LeaseBook, LeaseRecord
from snet.server.pool import ElementLoan, ElementPool, Received, is_finite

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
    # the gone worker's leases are no longer accepted
    with pytest.raises(RejectedUpdate):
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


# ---------------------------------------------------------------- ElementPool


LAYOUT = ElementLayout.for_network(NetworkSpec((3, 2), ()))  # 8 floats


def update_array() -> tuple[ArrayInfo, ...]:
    return (ArrayInfo("<f4", (LAYOUT.size,), "none", LAYOUT.nbytes),)


def test_pool_acquire_release_and_overflow() -> None:
    pool = ElementPool(LAYOUT, size=2)
    events: list[str] = []
    pool.on_empty = lambda: events.append("empty")
    pool.on_available = lambda: events.append("available")
    assert pool.free == 2
    a = pool.acquire()
    assert events == []
    b = pool.acquire()
    assert events == ["empty"]
    assert {a.index, b.index} == {0, 1}
    assert a.flat.shape == (LAYOUT.size,) and a.flat.dtype == np.float32
    assert not np.shares_memory(a.flat, b.flat)
    assert pool.free == 0 and pool.in_use == 2 and pool.overflows == 0
    c = pool.acquire()  # the pool is dry: a fresh element, counted
    assert c.index == -1
    assert pool.overflows == 1 and pool.in_use == 3
    assert events == ["empty", "empty"]
    c.release()  # overflow elements are not kept
    assert pool.free == 0 and pool.in_use == 2
    assert events == ["empty", "empty"]
    a.release()
    assert pool.free == 1 and pool.in_use == 1
    assert events == ["empty", "empty", "available"]
    b.release()
    assert pool.free == 2 and pool.in_use == 0
    assert events == ["empty", "empty", "available"]  # only on the empty -> free edge
    again = {pool.acquire().index, pool.acquire().index}
    assert again == {0, 1}  # the same preallocated elements are reused
    assert pool.overflows == 1


def test_pool_needs_an_element() -> None:
    with pytest.raises(ValueError):
        ElementPool(LAYOUT, size=0)


def test_pool_payload_target_only_for_matching_updates() -> None:
    pool = ElementPool(LAYOUT, size=2)
    target = pool.payload_target("update", update_array(), LAYOUT.nbytes)
    assert target is not None
    buffer, token = target
    assert isinstance(token, ElementLoan)
    assert len(buffer) == LAYOUT.nbytes
    assert np.shares_memory(np.frombuffer(buffer, dtype=np.float32), token.flat)
    assert pool.in_use == 1
    # other message types and other layouts are not received into the pool
    refused = [
        ("weights", update_array()),
        ("evaluate", update_array()),
        ("update", (ArrayInfo("<f4", (LAYOUT.size + 1,), "none", LAYOUT.nbytes + 4),)),
        ("update", (ArrayInfo("<f2", (LAYOUT.size,), "none", LAYOUT.nbytes // 2),)),
        ("update", (ArrayInfo("<f4", (2, 4), "none", LAYOUT.nbytes),)),
        ("update", (*update_array(), *update_array())),
        ("update", ()),
    ]
    for message_type, arrays in refused:
        nbytes = sum(info.nbytes for info in arrays)
        assert pool.payload_target(message_type, arrays, nbytes) is None, (message_type, arrays)
    assert pool.in_use == 1
    assert pool.free == 1


def test_pool_receives_updates_in_place_through_the_decoder() -> None:
    pool = ElementPool(LAYOUT, size=1)
    decoder = FrameDecoder(sink=pool)
    element = np.arange(LAYOUT.size, dtype=np.float32)
    update = Update(1, 2, 0, 4, 3.5, 2, 0.01, element=element)
    ((message, slot),) = decoder.feed_decoded(encode_bytes(update))
    assert isinstance(message, Update)
    assert isinstance(slot, ElementLoan)
    assert slot.index == 0
    assert np.shares_memory(message.element, slot.flat)
    np.testing.assert_array_equal(slot.flat, element)
    assert pool.free == 0
    # a Weights frame of the same layout is not put in the pool
    ((weights, weights_slot),) = decoder.feed_decoded(
        encode_bytes(Weights(1, 0, 0.1, 0, element=element))
    )
    assert isinstance(weights, Weights)
    assert weights_slot is None
    slot_element = slot.element
    slot.release()
    assert pool.free == 1
    # the released element is reused for the next update
    ((second, second_slot),) = decoder.feed_decoded(encode_bytes(update))
    assert isinstance(second, Update)
    assert second_slot.element is slot_element


def test_a_loan_gives_its_element_back_once() -> None:
    pool = ElementPool(LAYOUT, size=2)
    loan = pool.acquire()
    element = loan.element
    loan.release()
    loan.release()  # a second release does nothing: the element is not freed twice
    assert pool.free == 2 and pool.in_use == 0 and loan.released
    with pytest.raises(RuntimeError):
        _ = loan.flat  # the element is not reachable through a released loan
    again = pool.acquire()
    assert again.element is element and not again.released


def test_received_owns_the_loan_it_holds() -> None:
    pool = ElementPool(LAYOUT, size=2)
    update = Update(1, 2, 0, 4, 3.5, 2, 0.01)
    received = Received(update, pool.acquire())
    decoded_into = pool.acquire()
    received.adopt(decoded_into)  # an encoded update decoded into a second element
    assert pool.free == 1 and received.loan is decoded_into
    received.release()
    received.release()
    assert pool.free == 2 and pool.in_use == 0
    Received(update, None).release()  # a payload that did not fit the pool: nothing held


def test_pool_element_of_abandoned_frame_comes_back() -> None:
    pool = ElementPool(LAYOUT, size=1)
    decoder = FrameDecoder(sink=pool)
    frame = encode_bytes(Update(1, 2, 0, 4, 3.5, 2, 0.01, element=np.ones(8, np.float32)))
    assert decoder.feed(frame[:-3]) == []
    assert pool.free == 0
    token = decoder.abandon()
    assert isinstance(token, ElementLoan)
    token.release()
    assert pool.free == 1 and pool.in_use == 0


def test_is_finite() -> None:
    assert is_finite(np.zeros(4, dtype=np.float32))
    assert not is_finite(np.array([0.0, np.nan], dtype=np.float32))
    assert not is_finite(np.array([np.inf, 0.0], dtype=np.float32))
    assert not is_finite(np.array([-np.inf], dtype=np.float32))
