"""Finite but implausible input is refused too (issue 12 finding 5), through a real server."""

from __future__ import annotations

import numpy as np

from snet.cli.status import render
from snet.protocol import PROTOCOL_VERSION
from snet.protocol.messages import (
    ErrorMessage,
    Goodbye,
    Heartbeat,
    Hello,
    Lease,
    ServerHello,
    Update,
    Weights,
    WorkerReport,
)
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.protocol.worker_name import printable

from helpers import SMALL_JOB, Cluster, wait_until
from raw_client import RawClient

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))


def test_implausible_updates_and_reports_are_refused_and_change_nothing(
    cluster: Cluster,
) -> None:
    server = cluster.server("--mode", "async", "--epochs", "1", "--linger-seconds", "30",
                            *SMALL_JOB)  # fmt: skip
    weights_before = server.get("/weights")
    bad = RawClient(server.port, "forger")
    bad.handshake()
    base: Weights = bad.receive(Weights)
    lease: Lease = bad.receive(Lease)
    offset = 0

    def send(element: np.ndarray, correct: int = 0, loss: float = 1.0) -> ErrorMessage:
        nonlocal offset
        bad.send(Update(base.version, lease.lease_id, offset, 64, loss, correct, 0.01, element))
        offset += 64
        refusal: ErrorMessage = bad.receive(ErrorMessage)
        assert not refusal.fatal and refusal.code == "update_rejected"
        return refusal

    assert "overflows" in send(np.full(LAYOUT.size, 1e30, np.float32)).text
    mutated = np.full(LAYOUT.size, 1e-3, np.float32)
    mutated[17] = 2.0**43
    assert "beyond" in send(mutated).text
    assert "all zeros" in send(np.zeros(LAYOUT.size, np.float32)).text
    honest = np.full(LAYOUT.size, 1e-3, np.float32)
    assert "correct of 64" in send(honest, correct=7_800_000_000_000_000).text
    assert "loss of nan" in send(honest, loss=float("nan")).text
    nested: object = 1
    for _ in range(990):
        nested = [nested]
    bad.send(WorkerReport(0.0, {"x": nested}))
    assert "nested deeper" in bad.receive(ErrorMessage).text
    bad.send(Heartbeat(0.0))  # the connection survived every refusal

    status = server.status()
    assert status["updates_rejected"] == 5 and status["updates_applied"] == 0
    assert server.get("/weights") == weights_before  # bit for bit
    # names: a newline would forge log and /metrics lines; a duplicate gets a suffix
    forged = RawClient(server.port, "forged")
    forged.receive(ServerHello)
    forged.send(Hello(PROTOCOL_VERSION, "w1\nsnet_updates_applied 1e9", "raw", (), b""))
    refusal = forged.receive(ErrorMessage)
    assert refusal.fatal and "not printable" in refusal.text and forged.closed_by_peer()
    twin = RawClient(server.port, "forger")
    twin.handshake()
    names = sorted(row["name"] for row in server.status()["workers"] if row["state"] != "gone")
    assert names == ["forger", "forger-2"]
    bad.close()
    twin.close()
    wait_until(lambda: server.status()["workers_live"] == 0, 10, "both to be gone")


def test_a_peers_words_cannot_forge_log_lines_or_drive_the_terminal(cluster: Cluster) -> None:
    """An error's code and text, a goodbye's reason and a backend's name went into the
    server's log as sent: a newline wrote a whole forged line ("... ERROR snet.server:
    FORGED"), an ESC reached the terminal. They are logged with escapes now."""
    server = cluster.server("--mode", "async", "--epochs", "50", *SMALL_JOB)
    forged = "2026-11-28 12:00:00,000 ERROR   snet.server: FORGED"
    for index, last_words in enumerate(
        [ErrorMessage("bad\ncode", f"text\n{forged}1\x1b[2J", True), Goodbye(f"bye\n{forged}2")]
    ):
        peer = RawClient(server.port, f"forger{index}")
        peer.receive(ServerHello)
        peer.send(Hello(PROTOCOL_VERSION, f"forger{index}", "\x1b[31mred", (), b""))
        peer.receive(Weights)
        peer.send(last_words)
        assert peer.closed_by_peer()
    log = wait_until(lambda: (text := cluster.log("server")) and "FORGED2" in text and text,
                     30, "the goodbye in the log")  # fmt: skip
    assert not [line for line in log.splitlines() if line.startswith("2026-11-28 12:00:00")]
    assert "\x1b" not in log
    assert f"text\\x0a{forged}1\\x1b[2J" in log and f"bye\\x0a{forged}2" in log
    row = {"name": "forger", "backend": "\x1b[31mred", "state": "gone", "address": "-",
           "updates_sent": 0, "staleness_mean": 0.0, "mcups": 0.0, "last_seen": 0.0}  # fmt: skip
    shown = render({**server.status(), "workers": [row]})
    assert "\x1b" not in shown and "\\x1b[31mred" in shown
    # a line separator splits a line for some readers; bidi controls reorder what one sees
    assert printable("a\u2028b\u202ec\u2066") == "a\\u2028b\\u202ec\\u2066"
