"""The layout of tests/: test modules live in a folder named for what they test (a package under tasks/, or the stack,
aws, house); shared helpers live in tests/helpers/ (or conftest.py); no module under tests/ imports a test module or
conftest, and a child process started by a test module runs a function of that module only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
MODULES = sorted(TESTS.glob("*.py")) + sorted(TESTS.glob("*/*.py"))
CHILD_CALL = re.compile(r"^tests\.(?:\w+\.)?(test_\w+):\w+$")  # "module:function" handed to a child process
# folders of tests beside the packages': the local stack's processes, the AWS deploy, the house's own rules
OWN_FOLDERS = {"stack", "aws", "house"}


def _is_test_module(name: str) -> bool:
    """Whether a dotted module name is a test module or conftest (``tests.test_x``, ``test_x``, ``conftest``)."""
    parts = name.split(".")
    if parts[0] == "tests":
        parts = parts[1:]
        if len(parts) == 2 and parts[0] != "helpers":  # tests.<folder>.test_x
            parts = parts[1:]
    return len(parts) == 1 and (parts[0].startswith("test_") or parts[0] == "conftest")


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, module) for every import in ``tree``, at any depth; ``from tests import x`` counts as ``tests.x``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.lineno, node.module))
            if node.module == "tests":
                found += [(node.lineno, f"tests.{alias.name}") for alias in node.names]
    return found


def test_no_module_under_tests_imports_a_test_module():
    offending = [
        f"{path.relative_to(TESTS)}:{line}: {module}"
        for path in MODULES
        for line, module in imported_modules(ast.parse(path.read_text(), str(path)))
        if _is_test_module(module)
    ]
    assert not offending, f"{offending}: move what is shared into tests/helpers/ (fixtures: registered in conftest.py)"


def test_every_test_module_lives_in_the_folder_of_what_it_tests():
    packages = {p.name for p in (TESTS.parent / "tasks").iterdir() if (p / "__init__.py").exists()}
    loose = sorted(p.name for p in TESTS.glob("test_*.py"))
    folders = {p.parent.name for p in TESTS.glob("*/test_*.py")}
    assert not loose, f"{loose}: move each into the folder of the package it tests (or stack, aws, house)"
    assert folders <= packages | OWN_FOLDERS, f"{sorted(folders - packages - OWN_FOLDERS)}: not a package under tasks/"
    assert len(MODULES) > 100 and (TESTS / "etl" / "test_etl.py") in MODULES


def test_a_child_process_runs_a_function_of_the_module_that_starts_it():
    elsewhere = {}
    for path in MODULES:
        strings = [
            node.value
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
        ]
        calls = {m.group(1) for s in strings if (m := CHILD_CALL.match(s))} - {path.stem}
        if calls:
            elsewhere[path.name] = sorted(calls)
    assert not elsewhere, f"children started in another test module's functions: {elsewhere}"


def test_the_checks_see_every_form_of_import():
    source = (
        "import tests.test_a\nfrom tests.test_b import x\nfrom test_c import y\nfrom tests import test_d\n"
        "import conftest\nfrom tests.conftest import z\nfrom tests.helpers.etl import DAY\nimport test_helpers_like\n"
        "from tests.etl.test_f import v\nimport tests.helpers.test_data\n"
        "def f():\n    from tests.test_e import w\n"
    )
    flagged = [module for _, module in imported_modules(ast.parse(source)) if _is_test_module(module)]
    assert flagged == [
        "tests.test_a",
        "tests.test_b",
        "test_c",
        "tests.test_d",
        "conftest",
        "tests.conftest",
        "test_helpers_like",
        "tests.etl.test_f",
        "tests.test_e",
    ]
