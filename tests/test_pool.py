"""The server's element pool: loans, lazy making, overflow and in-place receiving."""

from __future__ import annotations

import numpy as np
import pytest

from snet.protocol.decoder import FrameDecoder
from snet.protocol.framing import ArrayInfo, encode_bytes
from snet.protocol.messages import Update, Weights
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server.pool import ElementLoan, ElementPool, ElementShare, Received, is_finite

LAYOUT = ElementLayout.for_network(NetworkSpec((3, 2), ()))  # 8 floats


def update_array() -> tuple[ArrayInfo, ...]:
    return (ArrayInfo("<f4", (LAYOUT.size,), "none", LAYOUT.nbytes),)


def test_pool_acquire_release_and_overflow() -> None:
    pool = ElementPool(LAYOUT, size=2)
    events: list[str] = []
    pool.watch(lambda: events.append("empty"), lambda: events.append("available"))
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
    assert again == {0, 1}  # the same elements are reused
    assert pool.overflows == 1 and pool.made == 2


def test_pool_makes_elements_only_as_they_are_first_needed() -> None:
    """A large pool (for bursts) costs nothing until used, and then only what was used:
    released elements are handed out again before a new one is made."""
    pool = ElementPool(LAYOUT, size=40_000)
    assert pool.made == 0 and pool.free == 40_000
    first = pool.acquire()
    assert (first.index, pool.made, pool.free) == (0, 1, 39_999)
    first.release()
    for _ in range(3):
        pool.acquire().release()
    assert pool.made == 1 and pool.free == 40_000  # the one element, over and over
    held = [pool.acquire() for _ in range(3)]
    assert [loan.index for loan in held] == [0, 1, 2] and pool.made == 3
    assert pool.free == 39_997 and pool.overflows == 0


def test_pool_needs_an_element() -> None:
    with pytest.raises(ValueError):
        ElementPool(LAYOUT, size=0)


def test_pool_payload_target_only_for_matching_updates() -> None:
    pool = ElementPool(LAYOUT, size=2)
    share = ElementShare(pool, lambda: True)  # a connection's sink (a worker that trains)
    target = share.payload_target("update", update_array(), LAYOUT.nbytes)
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
        assert share.payload_target(message_type, arrays, nbytes) is None, (message_type, arrays)
    assert pool.in_use == 1
    assert pool.free == 1


def test_pool_receives_updates_in_place_through_the_decoder() -> None:
    pool = ElementPool(LAYOUT, size=1)
    decoder = FrameDecoder(sink=ElementShare(pool, lambda: True))
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
    decoder = FrameDecoder(sink=ElementShare(pool, lambda: True))
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
