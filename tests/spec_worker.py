"""A worker written from protocol/README.md alone: the standard library, numpy and msgpack.

It imports nothing of snet, so that the specification, not the reference code, is what it
follows: if the server and the README drift apart, it stops training (test_spec_worker.py).
It asks for its frames inline (``frames_wanted``), trains sync or async as the job says,
scores the CV set when asked and leaves on ``goodbye``. Blocking sockets: run it in a
thread beside an in-process server.
"""

from __future__ import annotations

import select
import socket
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np

PREFIX = struct.Struct(">2sBBIQ")  # section 2: magic, version, flags, H, P (big-endian)


class Wire:
    """Frames over one TCP connection (sections 2 to 4); arrays come back as ``_arrays``."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.pending = bytearray()
        self.last_sent = time.monotonic()

    def _take(self, n: int) -> bytes:
        while len(self.pending) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            self.pending += chunk
        out = bytes(self.pending[:n])
        del self.pending[:n]
        return out

    def waiting(self, seconds: float) -> bool:
        """True when a frame (or part of one) is here to be read."""
        return bool(self.pending) or bool(select.select([self.sock], [], [], seconds)[0])

    def receive(self) -> dict[str, Any]:
        magic, version, flags, header_len, payload_len = PREFIX.unpack(self._take(16))
        if (magic, version, flags) != (b"SN", 1, 0):
            raise ValueError(f"not a version 1 frame: {magic!r} {version} {flags}")
        header: dict[str, Any] = msgpack.unpackb(self._take(header_len), raw=False)
        payload, arrays, position = self._take(payload_len), [], 0
        for d in header.pop("arrays", []):
            if d.get("codec", "none") != "none":
                raise ValueError("this worker agreed no codec")
            raw = payload[position : position + d["nbytes"]]
            arrays.append(np.frombuffer(raw, dtype=d["dtype"]).reshape(d["shape"]))
            position += d["nbytes"]
        header["_arrays"] = arrays
        return header

    def send(self, kind: str, fields: dict[str, Any], arrays: tuple[np.ndarray, ...] = ()) -> None:
        described = [
            {"dtype": a.dtype.str, "shape": list(a.shape), "codec": "none", "nbytes": a.nbytes}
            for a in arrays
        ]
        header = msgpack.packb({"type": kind, **fields, "arrays": described}, use_bin_type=True)
        payload = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)
        self.sock.sendall(PREFIX.pack(b"SN", 1, 0, len(header), len(payload)) + header + payload)
        self.last_sent = time.monotonic()


ACTIVATIONS = {  # section 8.5: f and f' written in terms of f's output
    "sigmoid": (lambda z: 1 / (1 + np.exp(-z)), lambda h: h * (1 - h)),
    "tanh": (np.tanh, lambda h: 1 - h * h),
    "relu": (lambda z: np.maximum(z, 0), lambda h: (h > 0).astype(h.dtype)),
}


class Network:
    """The element layout (section 7) and the forward and backward passes (section 8.5)."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.sizes: list[int] = job["network"]["sizes"]
        self.activations: list[str] = job["network"]["activations"]

    def layers(self, element: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        out, at = [], 0
        for fan_in, fan_out in zip(self.sizes[:-1], self.sizes[1:], strict=True):
            weights = element[at : at + fan_in * fan_out].reshape(fan_in, fan_out)
            at += fan_in * fan_out
            out.append((weights, element[at : at + fan_out]))
            at += fan_out
        return out

    def forward(self, element: np.ndarray, x: np.ndarray) -> list[np.ndarray]:
        outputs = [x]
        layers = self.layers(element)
        for index, (weights, bias) in enumerate(layers):
            z = outputs[-1] @ weights + bias
            if index < len(layers) - 1:
                outputs.append(ACTIVATIONS[self.activations[index]][0](z))
            else:
                e = np.exp(z - z.max(axis=1, keepdims=True))
                outputs.append(e / e.sum(axis=1, keepdims=True))
        return outputs

    def score(self, element: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
        p = self.forward(element, x)[-1]
        loss = float(-np.log(np.maximum(p[np.arange(len(y)), y], 1e-30)).sum())
        return loss, int((p.argmax(axis=1) == y).sum())

    def gradient(self, element: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """The sum over the bunch of the per-pattern gradients, laid out as an element."""
        outputs, layers = self.forward(element, x), self.layers(element)
        delta = outputs[-1].copy()
        delta[np.arange(len(y)), y] -= 1
        parts: list[np.ndarray] = []
        for index in range(len(layers) - 1, -1, -1):
            parts[:0] = [(outputs[index].T @ delta).ravel(), delta.sum(axis=0)]
            if index:
                derivative = ACTIVATIONS[self.activations[index - 1]][1]
                delta = (delta @ layers[index][0].T) * derivative(outputs[index])
        return np.concatenate(parts).astype("<f4")


class Frames:
    """The frames sent inline, the context windows (section 8.2) and the CV split."""

    def __init__(self, info: dict[str, Any], job: dict[str, Any]) -> None:
        _, lengths = info["_arrays"]
        self.ends = np.cumsum(lengths)
        self.starts = self.ends - lengths
        self.context = job["data"]["context"]
        self.x = np.zeros((info["total_frames"], info["features"]), np.float32)
        self.y = np.zeros(info["total_frames"], np.int64)
        self.have = np.zeros(info["total_frames"], bool)
        utterances = len(lengths)
        if info.get("cv_utterances", 0):
            cv = np.arange(utterances - info["cv_utterances"], utterances)
        else:
            order = np.random.default_rng(job["data"]["split_seed"]).permutation(utterances)
            n_cv = min(max(1, round(utterances * job["data"]["cv_fraction"])), utterances - 1)
            cv = np.sort(order[:n_cv])
        self.cv = np.concatenate([np.arange(self.starts[u], self.ends[u]) for u in cv])

    def add(self, message: dict[str, Any]) -> None:
        rows, features, labels = message["_arrays"]
        self.x[rows], self.y[rows], self.have[rows] = features, labels, True

    def _rows(self, centres: np.ndarray) -> np.ndarray:
        utterance = np.searchsorted(self.ends, centres, side="right")
        first, last = self.starts[utterance], self.ends[utterance] - 1
        shifts = range(-self.context, self.context + 1)
        return np.stack([np.clip(centres + k, first, last) for k in shifts], axis=1)

    def ready(self, centres: np.ndarray) -> bool:
        return bool(self.have[self._rows(centres)].all())

    def patterns(self, centres: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.x[self._rows(centres)].reshape(len(centres), -1), self.y[centres]


def cache_order(indices: np.ndarray, lease_id: int, seed: int, cache: int) -> np.ndarray:
    out = indices.copy()
    for start in range(0, len(indices), cache):
        run = indices[start : start + cache]
        out[start : start + len(run)] = run[
            np.random.default_rng([seed, lease_id, start]).permutation(len(run))
        ]
    return out


@dataclass
class Outcome:
    """How the worker's connection ended, and what it did."""

    goodbye: str = ""
    updates: int = 0
    evaluations: int = 0
    errors: list[str] = field(default_factory=list)


def run_worker(host: str, port: int, name: str = "spec-worker", timeout: float = 30) -> Outcome:
    """Join the server at ``host:port``, train until it says goodbye, return how it went."""
    wire, outcome = Wire(host, port, timeout), Outcome()
    hello = wire.receive()
    if hello["type"] != "server_hello" or hello["auth_required"]:
        raise ConnectionError(f"cannot join: {hello}")
    wire.send("hello", {"protocol_version": 1, "worker_name": name, "backend": "numpy",
                        "capabilities": [], "proof": b""})  # fmt: skip
    welcome = wire.receive()
    if welcome["type"] != "welcome":
        raise ConnectionError(f"not welcomed: {welcome}")
    job, net = welcome["job"], Network(welcome["job"])
    data = Frames(wire.receive(), job)  # data_info follows welcome (section 8.1)
    wire.send("frames_wanted", {"reason": "reads no data: asks for frames inline"})
    limit = 1 if job["mode"] == "sync" else job["max_in_flight"]  # section 8.4
    cache = job["bunch_size"] * job["shuffle_cache_bunches"]
    weights: dict[str, Any] = {}
    leases: list[dict[str, Any]] = []
    asked: list[dict[str, Any]] = []
    sent = 0
    try:
        while True:
            while wire.waiting(0):
                message = wire.receive()
                kind = message["type"]
                if kind == "weights":
                    weights = message
                elif kind == "lease":
                    order = cache_order(
                        message["_arrays"][0], message["lease_id"], job["seed"], cache
                    )
                    leases.append({"id": message["lease_id"], "order": order, "offset": 0})
                elif kind == "frames":
                    data.add(message)
                elif kind == "evaluate":
                    asked.append(message)
                elif kind == "error":
                    outcome.errors.append(f"{message['code']}: {message['text']}")
                elif kind == "goodbye":
                    outcome.goodbye = message["reason"]
                    return outcome
            if asked and data.ready(data.cv):  # answered between bunches (section 8.4)
                task = asked.pop(0)
                loss, correct = net.score(task["_arrays"][0], *data.patterns(data.cv))
                wire.send("eval_result", {"version": task["version"], "epoch": task["epoch"],
                                          "frames": len(data.cv), "correct": correct,
                                          "loss_sum": loss})  # fmt: skip
                outcome.evaluations += 1
            elif (
                weights
                and leases
                and sent - weights["settled"] < limit  # section 8.4's flow control
                and data.ready(leases[0]["order"])  # its frames may come after the lease
            ):
                lease = leases[0]
                count = min(job["bunch_size"], len(lease["order"]) - lease["offset"])
                x, y = data.patterns(lease["order"][lease["offset"] : lease["offset"] + count])
                started = time.perf_counter()
                gradient = net.gradient(weights["_arrays"][0], x, y)
                loss, correct = net.score(weights["_arrays"][0], x, y)
                wire.send("update", {"base_version": weights["version"], "lease_id": lease["id"],
                                     "offset": lease["offset"], "patterns": count,
                                     "loss_sum": loss, "correct": correct,
                                     "compute_seconds": time.perf_counter() - started},
                          (gradient,))  # fmt: skip
                sent += 1
                outcome.updates += 1
                lease["offset"] += count
                if lease["offset"] == len(lease["order"]):
                    leases.pop(0)
            elif not wire.waiting(1.0) and time.monotonic() - wire.last_sent > 4:
                wire.send("heartbeat", {"sent_at": time.time()})  # section 8.7
    finally:
        wire.sock.close()
