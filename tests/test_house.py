"""The house: each module imports only from its own floor or below, with no circle, and a pipeline is one package.

    deployments ─▶ flows ─▶ tasks/<pipeline> ─▶ tasks/{reconcile,health,retention} ─▶ tasks/landing ─▶ tasks/core ─▶
    blocks

The rooms are found, not listed: every package under tasks/ other than the shared ones is a pipeline's, wherever its
folder lies (the same folder under another sys.path entry joins the package).

Imports inside functions count too: a circle hidden in a function is still a circle.
"""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

TOPS = ("blocks", "tasks", "flows", "deployments")
SHARED = ("reconcile", "health", "retention")
BELOW_PIPELINES = {"blocks": 0, "tasks.core": 1, "tasks.landing": 2, **{f"tasks.{s}": 3 for s in SHARED}}


def _folders(top: str) -> list[Path]:
    """The folders of package ``top``: the repository's, and the same folder under any other sys.path entry (a
    pipeline kept elsewhere joins the package)."""
    return [Path(folder) for folder in importlib.import_module(top).__path__]


def _modules() -> dict[str, Path]:
    found = {}
    for top in TOPS:
        for folder in _folders(top):
            for path in folder.rglob("*.py"):
                name = ".".join((top, *path.relative_to(folder).with_suffix("").parts)).removesuffix(".__init__")
                found[name] = path
    return found


def pipeline_packages() -> list[str]:
    """Every package under tasks/ that is no shared room: a pipeline's, wherever it lies."""
    rooms = {path.name for folder in _folders("tasks") for path in folder.iterdir() if (path / "__init__.py").is_file()}
    return sorted(room for room in rooms if f"tasks.{room}" not in BELOW_PIPELINES)


# floor of each room: a module may import its own room, or rooms on a lower floor (the shared upkeep packages may
# import one another: health reads retention's rules type); every pipeline package sits on floor 4
FLOORS = {**BELOW_PIPELINES, **{f"tasks.{p}": 4 for p in pipeline_packages()}, "flows": 5, "deployments": 6}


def _imports() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (``from a import b`` counts ``a.b`` when that is a module)."""
    modules = _modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            edges[name] |= {t for t in targets if t in modules and t != name}
    return edges


def _room(module: str) -> str | None:
    parts = module.split(".")
    for size in (2, 1):
        if ".".join(parts[:size]) in FLOORS:
            return ".".join(parts[:size])
    return None


def _up_or_across(module: str, target: str) -> bool:
    """Whether ``module`` importing ``target`` goes up a floor, or across to another room of its floor (two
    pipelines); the shared upkeep packages (floor 3) may import one another."""
    room, other = _room(module), _room(target)
    if room is None or other is None or room == other:
        return False
    return FLOORS[other] > FLOORS[room] or (FLOORS[other] == FLOORS[room] != 3)


def test_no_module_imports_a_room_above_its_own_or_another_pipeline():
    wrong = sorted(f"{m} -> {t}" for m, targets in _imports().items() for t in targets if _up_or_across(m, t))
    assert wrong == []


def test_no_import_circle():
    edges = _imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in list(_modules()):
        if module not in index:
            visit(module)
    assert circles == []


def test_only_the_records_flow_imports_the_records_pipeline():
    importers = {
        module
        for module, targets in _imports().items()
        if module.startswith("flows.") and any(t == "tasks.records" or t.startswith("tasks.records.") for t in targets)
    }
    assert importers == {"flows.records"}


def test_every_module_sits_in_a_room_with_a_floor():
    assert sorted(m for m in _modules() if _room(m) is None and m not in TOPS) == []


def test_every_pipeline_package_declares_itself_and_its_keys():
    from tasks.core import registry

    declared = {p.name for p in registry.pipelines()}
    assert pipeline_packages() and set(pipeline_packages()) <= declared
    for name in pipeline_packages():
        assert {"tasks." + name + ".pipeline", "tasks." + name + ".keys"} <= set(_modules()), name
