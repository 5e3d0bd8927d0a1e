"""The house as the code lays it out: its modules (wherever a package's folders lie), the rooms and their floors, and
who imports whom. Read by tests/house/test_house.py, and by tests/house/test_pipeline_package.py's child for a
pipeline kept in another folder; the flow modules as tests/core/test_flow_policies.py pins them."""

from __future__ import annotations

import ast
import importlib
import pkgutil
from collections import defaultdict
from pathlib import Path

TOPS = ("blocks", "tasks", "flows", "deployments")
SHARED = ("reconcile", "health", "retention")
BELOW_PIPELINES = {"blocks": 0, "tasks.core": 1, "tasks.landing": 2, **{f"tasks.{s}": 3 for s in SHARED}}


def folders(top: str) -> list[Path]:
    """The folders of package ``top``: the repository's, and the same folder under any other sys.path entry (a
    pipeline kept elsewhere joins the package)."""
    return [Path(folder) for folder in importlib.import_module(top).__path__]


def modules() -> dict[str, Path]:
    """Every module of ours by dotted name -> its file, in every folder of each top package."""
    found = {}
    for top in TOPS:
        for folder in folders(top):
            for path in folder.rglob("*.py"):
                name = ".".join((top, *path.relative_to(folder).with_suffix("").parts)).removesuffix(".__init__")
                found[name] = path
    return found


def pipeline_packages() -> list[str]:
    """Every package under tasks/ that is no shared room: a pipeline's, wherever it lies."""
    rooms = {path.name for folder in folders("tasks") for path in folder.iterdir() if (path / "__init__.py").is_file()}
    return sorted(room for room in rooms if f"tasks.{room}" not in BELOW_PIPELINES)


# floor of each room: a module may import its own room, or rooms on a lower floor (the shared upkeep packages may
# import one another: health reads retention's rules type); every pipeline package sits on floor 4
FLOORS = {**BELOW_PIPELINES, **{f"tasks.{p}": 4 for p in pipeline_packages()}, "flows": 5, "deployments": 6}


def imports() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (``from a import b`` counts ``a.b`` when that is a module)."""
    found = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in found.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                continue
            edges[name] |= {t for t in targets if t in found and t != name}
    return edges


def room_of(module: str) -> str | None:
    """The room (a key of FLOORS) that ``module`` lies in; None for a top package's own __init__."""
    parts = module.split(".")
    for size in (2, 1):
        if ".".join(parts[:size]) in FLOORS:
            return ".".join(parts[:size])
    return None


def up_or_across(module: str, target: str) -> bool:
    """Whether ``module`` importing ``target`` goes up a floor, or across to another room of its floor (two
    pipelines); the shared upkeep packages (floor 3) may import one another."""
    room, other = room_of(module), room_of(target)
    if room is None or other is None or room == other:
        return False
    return FLOORS[other] > FLOORS[room] or (FLOORS[other] == FLOORS[room] != 3)


def flow_modules() -> tuple[str, ...]:
    """Every module of flows/ (the shared policies aside), wherever the flows package's folders lie."""
    import flows

    return tuple(sorted(m.name for m in pkgutil.iter_modules(flows.__path__) if m.name != "policies"))
