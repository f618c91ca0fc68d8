"""The packages' layering, read from the source with ``ast`` (nothing is imported).

    bench                   benchmarks: may use everything below
    cli                     the ``specgate`` command: argument parsing, ``serve``, ``up``
    gateway | backends      the server | launch profiles, deployment files, local processes
    contracts               what both sides share: config schema, launch profiles, paths,
                            task vocabulary, vLLM metrics, capture files

A module imports only from its own package or a lower layer; ``gateway`` and ``backends``
never import each other; and no two modules import each other, directly or round a loop
(imports inside functions included: a lazy import still ties the modules together).
A ``__main__`` module (``python -m gateway``) is an entry point that nothing imports: it sits
on top wherever its file is, and may import ``cli``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYER = {"contracts": 0, "gateway": 1, "backends": 1, "cli": 2, "bench": 3}
WEB = ("fastapi", "starlette", "uvicorn", "httpx", "httpx_sse", "aiohttp")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the layered packages, by dotted name."""
    return {module_name(p): p for pkg in LAYER for p in sorted((ROOT / pkg).rglob("*.py"))}


def imported(name: str, path: Path) -> Iterator[str]:
    """Every module name ``path`` imports, at the top or inside functions (``from a import
    b`` yields ``a`` and ``a.b``: ``b`` may be a module)."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    mods = modules()
    return {n: {m for m in imported(n, p) if m in mods and m != n} for n, p in mods.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_import_goes_down_a_layer_or_stays_in_its_package() -> None:
    wrong = [
        f"{a} imports {b}"
        for a, targets in graph().items()
        for b in sorted(targets)
        if (pa := a.split(".")[0]) != (pb := b.split(".")[0])
        and LAYER[pb] >= LAYER[pa]
        and not (a.endswith(".__main__") and pb == "cli")
    ]
    assert wrong == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_nothing_imports_an_entry_point() -> None:
    assert [
        a for a, targets in graph().items() if any(t.endswith("__main__") for t in targets)
    ] == []


def test_the_cycle_finder_finds_a_loop() -> None:
    loop = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(loop) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("name", sorted(n for n in modules() if n.startswith("contracts")))
def test_contracts_need_no_web_stack(name: str) -> None:
    path = modules()[name]
    web = [m for m in imported(name, path) if m.split(".")[0] in WEB]
    assert web == [], f"{name} imports {web}: contracts are plain data and parsing"


def package_of(name: str) -> str:
    """``gateway.routing.policy`` -> ``gateway.routing``; a top module is its own package."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else name


PURE = ("gateway.classify", "gateway.speculation", "gateway.routing")


def test_the_server_packages_form_no_loop() -> None:
    """Inside ``gateway/``, the function packages (classify, speculation, routing, learning,
    upstream, telemetry, api) and the top modules depend one way: a loop would be two
    packages each needing the other."""
    edges: dict[str, set[str]] = {}
    for a, targets in graph().items():
        if a.startswith("gateway."):
            edges.setdefault(package_of(a), set()).update(
                package_of(b) for b in targets if b.startswith("gateway.")
            )
    assert cycles({a: bs - {a} for a, bs in edges.items()}) == []


@pytest.mark.parametrize("name", sorted(n for n in modules() if n.startswith(PURE)))
def test_routing_decisions_are_pure(name: str) -> None:
    """Classification, speculation knowledge and the routing policy need no HTTP: no web
    stack, and nothing of the server's I/O side (upstream, api, telemetry, the service)."""
    mods = modules()
    path = mods[name]
    allowed = (*PURE, "gateway.errors", "contracts")
    wrong = [
        m
        for m in imported(name, path)
        if m.split(".")[0] in WEB
        or (m.split(".")[0] in LAYER and not m.startswith(allowed) and m in mods)
    ]
    assert wrong == [], f"{name} imports {wrong}"


@pytest.mark.parametrize("name", sorted(n for n in modules() if n.startswith("gateway.upstream")))
def test_upstream_raises_only_its_own_failures(name: str) -> None:
    """The upstream layer reports failures as :mod:`gateway.failures` (or its client's own
    errors); which status and envelope the client gets is :mod:`gateway.errors`' choice."""
    wrong = [m for m in imported(name, modules()[name]) if m.startswith("gateway.errors")]
    assert wrong == [], f"{name} imports {wrong}"


@pytest.mark.parametrize("name", sorted(n for n in modules() if n.startswith("gateway.api")))
def test_the_http_layer_does_not_forward(name: str) -> None:
    """The HTTP layer adapts (reads bodies, sends answers): opening backends with failover
    is the pipeline's stage (:mod:`gateway.pipeline`), not a handler's."""
    wrong = [m for m in imported(name, modules()[name]) if m.startswith("gateway.upstream.forward")]
    assert wrong == [], f"{name} imports {wrong}"
