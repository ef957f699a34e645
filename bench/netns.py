"""A slow network made of Linux network namespaces, for wall-clock benchmarks (needs root).

::

    snetb-srv (10.232.0.1) ──veth── snetb-sw [bridge br0] ──veth── snetb-w1 (10.232.0.11)
                                                           ├──veth── snetb-w2 (10.232.0.12)
                                                           └── ...

Every veth end is shaped with ``tc qdisc ... tbf`` to the same rate in its sending
direction, so the server's single link is the shared bottleneck, as with a server whose
network card runs at that rate (this kernel has no netem, so no delay is added). The
addresses are private and exist only inside the namespaces this module creates;
``SlowNetwork`` removes everything it made when its ``with`` block ends, whatever happens.
"""

from __future__ import annotations

import subprocess
from types import TracebackType

PREFIX = "snetb"
SUBNET = "10.232.0"
SERVER_ADDRESS = f"{SUBNET}.1"


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


class SlowNetwork:
    """A server namespace and ``workers`` worker namespaces behind a shaped bridge."""

    def __init__(self, workers: int, rate: str = "100mbit") -> None:
        self.workers = workers
        self.rate = rate
        self.server = f"{PREFIX}-srv"
        self.switch = f"{PREFIX}-sw"
        self.worker_namespaces = [f"{PREFIX}-w{i + 1}" for i in range(workers)]
        self._made: list[str] = []

    @staticmethod
    def worker_address(index: int) -> str:
        return f"{SUBNET}.{11 + index}"

    def _namespace(self, name: str) -> None:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)  # a leftover
        _run("ip", "netns", "add", name)
        self._made.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _shape(self, namespace: str, device: str) -> None:
        # burst: enough for the rate at 1000 Hz timers; latency bounds the queue
        _run(
            "tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf",
            "rate", self.rate, "burst", "64kb", "latency", "100ms",
        )  # fmt: skip

    def _attach(self, namespace: str, address: str, port: str) -> None:
        """A veth pair from ``namespace`` (eth0, ``address``) to a bridge port."""
        _run(
            "ip", "link", "add", "eth0", "netns", namespace,
            "type", "veth", "peer", "name", port, "netns", self.switch,
        )  # fmt: skip
        _run("ip", "-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _run("ip", "-n", namespace, "link", "set", "eth0", "up")
        _run("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
        self._shape(namespace, "eth0")
        self._shape(self.switch, port)

    def __enter__(self) -> SlowNetwork:
        try:
            self._namespace(self.switch)
            _run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            _run("ip", "-n", self.switch, "link", "set", "br0", "up")
            self._namespace(self.server)
            self._attach(self.server, SERVER_ADDRESS, "p-srv")
            for index, namespace in enumerate(self.worker_namespaces):
                self._namespace(namespace)
                self._attach(namespace, self.worker_address(index), f"p-w{index + 1}")
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.remove()

    def remove(self) -> None:
        """Delete every namespace made (their veths, bridge and qdiscs go with them)."""
        for name in reversed(self._made):
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        self._made.clear()

    def command(self, namespace: str, args: list[str]) -> list[str]:
        """``args`` run inside ``namespace``."""
        return ["ip", "netns", "exec", namespace, *args]
