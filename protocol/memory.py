"""What a worker's memory must hold for a network, and how a worker states its memory.

An emulated Spert board (client/spert/board.py) holds a network only if its weights (two
32-bit copies: the loaded one and the updated one), the pattern chunk, a bunch's
activations, deltas and accumulators and the lookup tables fit its 8 MB (``MemoryPlan``).
In np mode (docs/network-parallel.md) a board holds a slice of the hidden units, so the
server must know how many units each board can take before it cuts the hidden layer: a
worker with bounded memory states it in its ``Hello`` capabilities as
``memory:BYTES:CHUNK:FIXED`` (``WorkerMemory``: its memory, the patterns a forward chunk
holds, the bytes of its tables), and the server applies the same plan the board checks.
A worker that states nothing is taken to hold any slice.

``MemoryNeed`` is what a server or a worker process holds for a job's network (whole
float32 copies of its element, by what holds them, and other bytes), estimated before any
of it is allocated (server/footprint.py, client/footprint.py), and the one-line refusal
when this machine has less available (transport/host_memory.py reads how much). Pure: no
I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .errors import ConfigError
from .network import NetworkSpec
from .numbering import amount, is_plain_int
from .slices import slice_network

WORD16 = 2
WORD32 = 4
MEMORY_CAPABILITY = "memory"
GIB = 1 << 30


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes of a board's memory each part of a network needs."""

    weights: int
    patterns: int
    work: int
    tables: int

    @property
    def total(self) -> int:
        return self.weights + self.patterns + self.work + self.tables

    @classmethod
    def for_network(cls, spec: NetworkSpec, bunch: int, chunk: int, tables: int) -> MemoryPlan:
        """The plan of ``spec`` trained in bunches of ``bunch``, forward passes in chunks
        of ``chunk`` patterns, with ``tables`` bytes of lookup tables."""
        units = sum(spec.sizes[1:])
        rows = max(bunch, chunk)
        return cls(
            weights=2 * WORD32 * spec.connections,  # loaded copy and updated copy
            patterns=rows * (spec.input_size + 1) * WORD16,  # inputs and a target each
            # activations and deltas (16-bit) and one layer of 32-bit accumulators
            work=bunch * (2 * units * WORD16 + max(spec.sizes) * WORD32)
            + chunk * spec.output_size * WORD16,
            tables=tables,
        )

    def describe(self) -> str:
        mb = 1 << 20
        return (
            f"{self.total / mb:.2f} MB (weights {self.weights / mb:.2f}, patterns "
            f"{self.patterns / mb:.2f}, work {self.work / mb:.2f}, tables {self.tables / mb:.2f})"
        )


@dataclass(frozen=True)
class WorkerMemory:
    """A worker's stated memory: ``total`` bytes, forward chunks of ``chunk`` patterns and
    ``fixed`` bytes of tables (what ``MemoryPlan`` needs besides the network)."""

    total: int
    chunk: int
    fixed: int

    def capability(self) -> str:
        """As a ``Hello`` capability."""
        return f"{MEMORY_CAPABILITY}:{self.total}:{self.chunk}:{self.fixed}"

    def plan(self, spec: NetworkSpec, bunch: int) -> MemoryPlan:
        return MemoryPlan.for_network(spec, bunch, self.chunk, self.fixed)

    def units_held(self, spec: NetworkSpec, bunch: int) -> int:
        """The most hidden units of ``spec`` (one hidden layer) a slice on this worker may
        have with bunches of ``bunch`` (0: not even one). The plan grows with the units,
        so a bisection finds it."""
        low, high = 0, spec.sizes[1]  # low fits (or is 0), high + 1 does not (or is past)
        if self.plan(slice_network(spec, high), bunch).total <= self.total:
            return high
        while low < high:
            middle = (low + high + 1) // 2
            if self.plan(slice_network(spec, middle), bunch).total <= self.total:
                low = middle
            else:
                high = middle - 1
        return low


def stated_memory(capabilities: Iterable[str]) -> WorkerMemory | None:
    """The memory a worker states among its ``Hello`` capabilities (None: unbounded);
    ConfigError for a malformed statement."""
    for capability in capabilities:
        name, _, rest = capability.partition(":")
        if name != MEMORY_CAPABILITY:
            continue
        parts = rest.split(":")
        if len(parts) != 3 or not all(is_plain_int(p) and len(p) <= 15 for p in parts):
            raise ConfigError(
                f"memory capability {capability[:80]!r} is not memory:BYTES:CHUNK:FIXED"
            )
        total, chunk, fixed = (int(p) for p in parts)
        if chunk == 0:
            raise ConfigError(f"memory capability {capability[:80]!r}: a chunk of 0 patterns")
        return WorkerMemory(total, chunk, fixed)
    return None


@dataclass(frozen=True)
class MemoryNeed:
    """About how much memory one process holds for a network: ``copies`` of its float32
    element (how many, and what holds them) and ``other`` bytes (how many, and what).
    An estimate from what the code allocates, not a measurement: the interpreter,
    the data and short-lived temporaries come on top."""

    element_bytes: int
    copies: tuple[tuple[int, str], ...]
    other: tuple[tuple[int, str], ...] = ()

    @property
    def total(self) -> int:
        elements = sum(count for count, _ in self.copies)
        return elements * self.element_bytes + sum(count for count, _ in self.other)

    def refusal(
        self, network: str, where: str, most: int | None, bounded_by: str = "this machine's memory"
    ) -> str:
        """The one line refusing the network, or "" when it fits ``most`` bytes, the most
        the process could ever have (``bounded_by`` says what that is; None: unknown,
        taken as fitting: no check is better than a wrong one)."""
        if most is None or self.total <= most:
            return ""
        return f"{self.describe(network, where)}; {bounded_by} is {amount(most)}"

    def shortfall(self, network: str, where: str, available: int | None) -> str:
        """A warning when the need is more than the ``available`` bytes now (it may still
        be met as other processes free memory or the kernel reclaims it), else ""."""
        if available is None or self.total <= available:
            return ""
        return (
            f"{self.describe(network, where)}; {amount(available)} is available now: going "
            "on, but the kernel may end a process if that much is not freed"
        )

    def describe(self, network: str, where: str) -> str:
        """What the network needs and what holds it, in words."""
        elements = sum(count for count, _ in self.copies)
        parts = ", ".join(f"{count:,} {what}" for count, what in self.copies if count)
        others = "".join(f" and {amount(count)} for {what}" for count, what in self.other)
        return (
            f"network {network} needs about {amount(self.total)} of memory {where}: "
            f"{elements:,} float32 copies of its {amount(self.element_bytes)} of weights "
            f"({parts}){others}"
        )
