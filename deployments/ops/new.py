"""`pipelines new NAME [--seed N]`: a working pipeline scaffolded from ``deployments/scaffold/`` (docs/design.md
"How to add a pipeline").

    NAME and seed checked ──> each template rendered (``$name``, ``$flow``, ``$Name``, ``$ENV``, ``$seed``)
        ──> written, never over an existing file ──> imports sorted and lines wrapped (ruff)
        ──> `pipelines generate` run on the repository: prefect.yaml's deployments and the template take it in

What it writes lands a file under ``NAME/incoming/``, records an item in its own table through the state store's
conditional writes and runs a processing flow that ends the item ``done``; its test says so. What is left to a person
is the work itself: ``tasks/NAME/work.py``, and what the item records of it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import keyword
import os
import re
import string
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tasks.core.errors import PipelineError

SCAFFOLD = Path(__file__).resolve().parents[1] / "scaffold"  # the templates, one per file written
# seeds 90 and up are the shared upkeep's (health 90, retention 91), visited after every pipeline
UPKEEP_SEEDS = 90
NAME = re.compile(r"[a-z][a-z0-9_]*")
# the folders a pipeline's modules join: a name taken in any of them is taken
TAKEN_IN = ("tasks", "flows", "blocks", "deployments/ops", "deployments/samples")
GENERATOR = "deployments/ops/generate.py"  # a root without it (a bare folder) gets the files alone


class NotGenerated(PipelineError, RuntimeError):
    """`pipelines generate` failed on the repository holding the new pipeline: its files are written, the generated
    ones not."""


@dataclass(frozen=True)
class PipelineNames:
    """The spellings of one pipeline's name the templates use."""

    name: str  # the package and module name: checksum, demo_pipe
    seed: int

    def values(self) -> dict[str, str]:
        """The templates' placeholders: ``$name`` demo_pipe, ``$flow`` demo-pipe, ``$Name`` DemoPipe, ``$ENV``
        DEMO_PIPE, ``$title`` Demo pipe, ``$seed``."""
        words = self.name.split("_")
        return {
            "name": self.name,
            "flow": "-".join(words),
            "Name": "".join(word.capitalize() for word in words),
            "ENV": self.name.upper(),
            "title": " ".join(words).capitalize(),
            "seed": str(self.seed),
        }


def checkout() -> Path:
    """The repository this module belongs to (the default root)."""
    return Path(__file__).resolve().parents[2]


def taken_names(root: Path) -> set[str]:
    """Module and package names already in the folders a pipeline's modules join, under ``root``."""
    return {
        path.name.removesuffix(".py")
        for folder in TAKEN_IN
        if (root / folder).is_dir()
        for path in (root / folder).iterdir()
        if path.suffix == ".py" or (path / "__init__.py").is_file()
    }


def check_name(name: str, root: Path) -> str:
    """``name`` if it can name a new pipeline under ``root``: a lowercase identifier no module there has yet."""
    if not NAME.fullmatch(name) or keyword.iskeyword(name) or name.endswith("_") or "__" in name:
        raise ValueError(f"pipeline name {name!r}: use a lowercase identifier (a-z, digits, single '_' between words)")
    if name in taken_names(root):
        raise ValueError(f"pipeline name {name!r} is taken: a module or package of that name exists under {root}")
    return name


def declared_seeds() -> dict[int, str]:
    """Seed -> pipeline, for every declared pipeline."""
    from tasks.core import registry

    return {p.seed: p.name for p in registry.pipelines()}


def default_seed(seeds: dict[int, str]) -> int:
    """One above the highest pipeline seed (the upkeep's, 90 and up, aside)."""
    return max((seed for seed in seeds if seed < UPKEEP_SEEDS), default=0) + 1


def check_seed(seed: int, seeds: dict[int, str]) -> int:
    """``seed`` if no pipeline holds it and it lies below the upkeep's seeds."""
    if not 0 <= seed < UPKEEP_SEEDS:
        raise ValueError(f"seed {seed}: use 0 to {UPKEEP_SEEDS - 1} ({UPKEEP_SEEDS} and up are the shared upkeep's)")
    if seed in seeds:
        raise ValueError(f"seed {seed} is {seeds[seed]}'s: pick another (default: one above the highest)")
    return seed


def planned(names: PipelineNames) -> dict[str, str]:
    """Repository path -> rendered text, for every template (``a/b/__name__.py.tmpl`` -> ``a/b/<name>.py``)."""
    values = names.values()
    files = {}
    for template in sorted(SCAFFOLD.rglob("*.tmpl")):
        relative = template.relative_to(SCAFFOLD).as_posix().removesuffix(".tmpl")
        files[relative.replace("__name__", names.name)] = string.Template(template.read_text()).substitute(values)
    return files


def scaffold(name: str, seed: int | None = None, root: Path | None = None) -> dict[str, list[str]]:
    """Write a new pipeline ``name`` under ``root`` (default: this checkout), then regenerate what derives from the
    declarations there: the paths ``written`` (none if one exists) and those ``generated`` anew."""
    root = Path(root or checkout())
    seeds = declared_seeds()
    names = PipelineNames(check_name(name, root), check_seed(default_seed(seeds) if seed is None else seed, seeds))
    files = planned(names)
    existing = sorted(path for path in files if (root / path).exists())
    if existing:
        raise ValueError(f"not overwriting {', '.join(existing)}: nothing written")
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    _tidy(root, sorted(files))
    return {"written": sorted(files), "generated": _generated_entries(root)}


def _tidy(root: Path, paths: list[str]) -> None:
    """The written files' imports sorted and lines wrapped as `make test`'s ruff wants (both depend on the name)."""
    if importlib.util.find_spec("ruff") is None:
        return
    config = root / "pyproject.toml" if (root / "pyproject.toml").is_file() else checkout() / "pyproject.toml"
    ruff = [sys.executable, "-m", "ruff"]
    for command in (["check", "--select", "I", "--fix"], ["format"]):
        subprocess.run(
            [*ruff, *command, "--quiet", "--no-cache", "--config", str(config), *paths], cwd=root, check=True
        )


def _generated_entries(root: Path) -> list[str]:
    """`pipelines generate` run on ``root``: the generated files it rewrote (prefect.yaml, the template), none when
    ``root`` has no generator."""
    if not (root / GENERATOR).is_file():
        return []
    # a child process: this one imported the pipelines before the new one existed, and ``root`` may be another checkout
    done = subprocess.run(
        [sys.executable, "-m", "deployments.cli", "generate"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()[-1:] or [f"exit code {done.returncode}"]
        raise NotGenerated(f"`pipelines generate` failed in {root}: {said[0]} (the pipeline's files are written)")
    return json.loads(done.stdout)["written"]


def _new(args: argparse.Namespace) -> dict:
    """Scaffold, and say what was written and generated and what is left to write."""
    return {
        **scaffold(args.name, args.seed, args.root),
        "next": f"write the work in tasks/{args.name}/work.py, then run tests/{args.name}/test_{args.name}.py",
    }


def register(subparsers) -> None:
    """Add ``new``."""
    new = subparsers.add_parser(
        "new",
        help="scaffold a working pipeline: keys, declaration, landing, flows, settings, ops, sample and its test",
    )
    new.add_argument("name", metavar="NAME", help="a lowercase identifier: the package tasks/NAME and its modules")
    new.add_argument(
        "--seed",
        type=int,
        help="its seed document's number; with none, any number not taken: it orders the pipelines wherever they "
        f"are visited (tables, health, the demo). Default: one above the highest (below {UPKEEP_SEEDS})",
    )
    new.add_argument("--root", type=Path, help="the repository to write into (default: this checkout)")
    new.set_defaults(handler=_new)
