"""The house: each module imports only from its own floor or below, with no circle, and a pipeline is one package.

    deployments ─▶ flows ─▶ tasks/<pipeline> ─▶ tasks/{reconcile,health,retention} ─▶ tasks/landing ─▶ tasks/core ─▶
    blocks

The rooms are found, not listed: every package under tasks/ other than the shared ones is a pipeline's, wherever its
folder lies (the same folder under another sys.path entry joins the package).

Imports inside functions count too: a circle hidden in a function is still a circle.
"""

from __future__ import annotations

from tests.helpers.house import TOPS, imports, modules, pipeline_packages, room_of, up_or_across


def test_no_module_imports_a_room_above_its_own_or_another_pipeline():
    wrong = sorted(f"{m} -> {t}" for m, targets in imports().items() for t in targets if up_or_across(m, t))
    assert wrong == []


def test_no_import_circle():
    edges = imports()
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

    for module in list(modules()):
        if module not in index:
            visit(module)
    assert circles == []


def test_only_the_records_flow_imports_the_records_pipeline():
    importers = {
        module
        for module, targets in imports().items()
        if module.startswith("flows.") and any(t == "tasks.records" or t.startswith("tasks.records.") for t in targets)
    }
    assert importers == {"flows.records"}


def test_every_module_sits_in_a_room_with_a_floor():
    assert sorted(m for m in modules() if room_of(m) is None and m not in TOPS) == []


def test_every_pipeline_package_declares_itself_and_its_keys():
    from tasks.core import registry

    declared = {p.name for p in registry.pipelines()}
    assert pipeline_packages() and set(pipeline_packages()) <= declared
    for name in pipeline_packages():
        assert {"tasks." + name + ".pipeline", "tasks." + name + ".keys"} <= set(modules()), name
