"""``NetLab``: hosts with their own network stacks, made of Linux network namespaces.

Every host is a namespace with one interface, ``eth0``, and its own address in a private
/24. The hosts are cabled to a bridge that lives in a namespace of its own (the switch),
so nothing is created in the machine's own namespace and no packet can leave the lab.
Each veth pair is created directly inside its two namespaces. Cutting a host's link takes
its switch port down: the host sees nothing, as when a cable is pulled.

Needs root and iproute2 (``ip``); ``NetLab.unavailable()`` says why not when it cannot work.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from helpers import run_process


class NetLabError(Exception):
    """An ``ip`` command failed; carries its command line and stderr."""


def _ip(*args: str) -> None:
    done = run_process(["ip", *args], timeout=20)
    if done.returncode != 0:
        raise NetLabError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class NetLab:
    """A switch namespace and hosts attached to it; ``close()`` removes them all."""

    subnet: str = "10.231.0"  # private, and only ever configured inside the lab
    tag: str = field(default_factory=lambda: f"sn{os.getpid() % 100000}")
    hosts: dict[str, str] = field(default_factory=dict)  # name -> address
    _namespaces: list[str] = field(default_factory=list)

    @staticmethod
    def unavailable() -> str | None:
        """Why namespaces cannot be made here, or None when they can."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        if shutil.which("ip") is None:
            return "iproute2's `ip` command is not installed"
        probe = f"sn{os.getpid() % 100000}probe"
        try:
            _ip("netns", "add", probe)
        except NetLabError as exc:
            return f"cannot create a network namespace: {exc}"
        _ip("netns", "del", probe)
        return None

    @property
    def switch(self) -> str:
        return f"{self.tag}sw"

    def namespace(self, host: str) -> str:
        return f"{self.tag}{host}"

    def start(self) -> None:
        """Create the switch: a bridge in its own namespace."""
        self._add_namespace(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def add_host(self, host: str, number: int) -> str:
        """A host namespace cabled to the switch, with address ``subnet.number``."""
        namespace, port = self.namespace(host), f"port-{host}"
        address = f"{self.subnet}.{number}"
        self._add_namespace(namespace)
        _ip(
            *("link", "add", "name", "eth0", "netns", namespace, "type", "veth"),
            *("peer", "name", port, "netns", self.switch),
        )
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        self.hosts[host] = address
        return address

    def cut(self, host: str) -> None:
        """Pull the host's cable: its switch port goes down."""
        _ip("-n", self.switch, "link", "set", f"port-{host}", "down")

    def mend(self, host: str) -> None:
        _ip("-n", self.switch, "link", "set", f"port-{host}", "up")

    def command(self, host: str, *argv: str) -> list[str]:
        """``argv`` run inside the host's namespace."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def close(self) -> None:
        """Delete every namespace made (their interfaces and the bridge go with them)."""
        for namespace in reversed(self._namespaces):
            run_process(["ip", "netns", "del", namespace], timeout=20)
        self._namespaces.clear()

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self._namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")
