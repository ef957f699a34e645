"""The import rules of the layout (README "Layout"), read from the source with ``ast``:

- protocol/ does no I/O: it imports no asyncio, sockets or file access modules and calls
  no ``open``;
- transport/ (the I/O protocol/ must not do, shared by both sides) imports protocol/ only;
- server/ and client/ never import each other; only cli/ imports both;
- nothing in the package imports bench/ (bench/ may import the package);
- the packages' imports of one another have no cycle.

Every import counts, also those inside functions, which run later but bind all the same.
"""

from __future__ import annotations

import ast
import functools
import gc
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("server", "client", "protocol", "transport", "data", "perf", "cli")
PARTS = (*PRODUCT, "bench")
NO_IO = {
    "asyncio", "socket", "socketserver", "selectors", "ssl", "uvloop", "aiohttp", "urllib",
    "http", "os", "io", "pathlib", "shutil", "tempfile", "glob", "fileinput", "mmap",
    "subprocess", "tomllib",
}  # fmt: skip


def _sources(part: str) -> list[Path]:
    return sorted(p for p in (ROOT / part).rglob("*.py") if "__pycache__" not in p.parts)


def _tree(path: Path) -> ast.Module:
    """The parsed source (each text parsed once per run: several rules read every file)."""
    return _parse(path.read_text(), str(path))


@functools.cache
def _parse(text: str, filename: str) -> ast.Module:
    # A syntax tree holds no reference cycle, so the collector has nothing to free in
    # one; the 250,000 objects of the trees set it off all the same, and its full passes
    # over the growing trees were 0.4-0.5 s of the 0.9 s these rules took.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(text, filename)
    finally:
        if collecting:
            gc.enable()


@pytest.fixture(autouse=True, scope="module")
def _trees_freed_after_this_module() -> Iterator[None]:
    """The parsed trees (some 250,000 objects) go when this module's tests are done: kept,
    every later ``gc.collect()`` (one after each lab test: loop_guard.py) walked them all,
    some 10 s of the fast ring."""
    yield
    _parse.cache_clear()
    _built_graph.cache_clear()


def _imports(path: Path, package: list[str] | None = None) -> list[str]:
    """The absolute names ``path`` imports, relative imports resolved from its folder
    (``package``: the folder's parts below the checkout, default where ``path`` is)."""
    package = package if package is not None else list(path.relative_to(ROOT).parent.parts)
    names = []
    for node in _statements(_tree(path)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                assert base, f"{path}: a relative import above its part"
                prefix = ".".join(["snet", *base] if base[0] in PRODUCT else base)
                module = f"{prefix}.{node.module}" if node.module else prefix
            else:
                module = node.module or ""
            names.append(module)
    return names


def _statements(tree: ast.Module) -> Iterator[ast.AST]:
    """Every statement in ``tree``, however deeply nested in other statements (an import is
    a statement, and statements sit only in other statements' bodies, handlers and match
    cases): ``ast.walk`` would also visit every expression, most of a tree and 1.5 s of
    the fast ring for these rules."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt | ast.excepthandler | ast.match_case):
                pending.append(child)


def _part(name: str) -> str | None:
    """The part of the layout an imported name belongs to (None: outside the project)."""
    words = name.split(".")
    if words[0] == "snet":
        return words[1] if len(words) > 1 and words[1] in PRODUCT else "snet"
    return words[0] if words[0] in ("bench",) else None


def _graph() -> dict[str, set[str]]:
    """Which parts each part imports (a copy: a rule may change it)."""
    return {part: set(others) for part, others in _built_graph().items()}


@functools.cache
def _built_graph() -> dict[str, frozenset[str]]:
    """The graph, built once per run: every rule that reads it would walk every tree."""
    graph: dict[str, set[str]] = {part: set() for part in PARTS}
    for part in PARTS:
        for path in _sources(part):
            for name in _imports(path):
                other = _part(name)
                if other is not None and other != part:
                    graph[part].add(other)
    return {part: frozenset(others) for part, others in graph.items()}


def test_the_parts_are_where_the_rules_look() -> None:
    for part in PARTS:
        assert _sources(part), f"no Python files in {part}/"
    assert (ROOT / "src" / "snet" / "perf").resolve() == ROOT / "perf"
    assert not (ROOT / "src" / "snet" / "bench").exists()


def test_protocol_does_no_io() -> None:
    for path in _sources("protocol"):
        modules = {name.split(".")[0] for name in _imports(path)}
        assert not modules & NO_IO, f"{path.relative_to(ROOT)} imports {modules & NO_IO}"
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id != "open", f"{path.relative_to(ROOT)} calls open()"


def test_protocol_imports_no_other_part() -> None:
    assert _graph()["protocol"] <= {"snet"}


def test_transport_imports_only_protocol() -> None:
    assert _graph()["transport"] <= {"protocol", "snet"}


@pytest.mark.parametrize(("part", "other"), [("server", "client"), ("client", "server")])
def test_server_and_client_never_import_each_other(part: str, other: str) -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in _sources(part)
        for name in _imports(path)
        if _part(name) == other
    ]
    assert not offenders


def test_only_cli_imports_both_server_and_client() -> None:
    both = [p for p in PRODUCT if {"server", "client"} <= _graph()[p]]
    assert both == ["cli"]


def test_nothing_in_the_package_imports_bench() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for part in PRODUCT
        for path in _sources(part)
        for name in _imports(path)
        if _part(name) == "bench"
    ]
    assert not offenders


def test_no_import_cycles_between_parts() -> None:
    graph = _graph()
    graph.pop("bench")  # bench imports the package and nothing imports it: no cycle through it
    for part in graph:
        graph[part].discard("snet")  # the namespace's own __init__ (its version) only
    done: set[str] = set()

    def visit(part: str, path: list[str]) -> None:
        assert part not in path, "import cycle: " + " -> ".join([*path, part])
        if part in done:
            return
        for other in sorted(graph[part]):
            visit(other, [*path, part])
        done.add(part)

    for part in sorted(graph):
        visit(part, [])


def test_the_rules_see_imports_inside_functions_and_relative_ones(tmp_path: Path) -> None:
    """The reader itself: a late import and relative ones all count."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def late():\n    from snet.server import app\n\n"
        "from .network import x\nfrom .. import y\nfrom . import child_env\n"
        "class Late:\n    def method(self):\n        with x:\n            import a.b\n"
        "try:\n    import c\nexcept ImportError:\n    import d\nelse:\n    import e\n"
        "finally:\n    import f\n"
        "match y:\n    case 1:\n        if x:\n            pass\n        else:\n"
        "            import g\n"
        "async def later():\n    async for _ in x:\n        while y:\n            import h\n"
    )
    found = _imports(probe, ["client", "spert"])
    assert sorted(found) == [
        "a.b",
        "c",
        "d",
        "e",
        "f",
        "g",
        "h",
        "snet.client",
        "snet.client.spert",
        "snet.client.spert.network",
        "snet.server",
    ]
    probe.write_text("from . import child_env\n")
    assert [_part(name) for name in _imports(probe, ["bench"])] == ["bench"]
