"""Every settings class of the project, so the docs and the tests visit them all: the blocks (``blocks/*.py``), then
the process settings (``EnvSettings``) of ``blocks/settings.py``, of each package's ``tasks/<package>/settings.py``
and of ``deployments/settings.py``. A new pipeline's classes join by where they are written, not by a list."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

from blocks.settings import EnvSettings

SHARED_FIRST = ("core", "landing")  # the floors below the pipelines, listed before them


def block_classes() -> list[type]:
    """Every block class, in ``blocks.__all__``'s order."""
    import blocks
    from blocks.base import ConfigBlock

    return [cls for name in blocks.__all__ if isinstance(cls := getattr(blocks, name), type) and cls is not ConfigBlock]


def settings_modules() -> list[str]:
    """The modules that hold process settings: blocks.settings, tasks.<package>.settings, deployments.settings."""
    import tasks

    packages = sorted(
        (module.name for module in pkgutil.iter_modules(tasks.__path__) if module.ispkg),
        key=lambda name: (SHARED_FIRST.index(name) if name in SHARED_FIRST else len(SHARED_FIRST), name),
    )
    found = [f"tasks.{name}.settings" for name in packages if importlib.util.find_spec(f"tasks.{name}.settings")]
    return ["blocks.settings", *found, "deployments.settings"]


def env_settings_classes() -> list[type[EnvSettings]]:
    """Every ``EnvSettings`` class, module by module, in the order each module defines them."""
    classes = []
    for name in settings_modules():
        module = importlib.import_module(name)
        classes += [
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, EnvSettings)
            and value is not EnvSettings
            and value.__module__ == name
        ]
    return classes


def settings_classes() -> list[type]:
    """The whole tree: the blocks, then the process settings."""
    return [*block_classes(), *env_settings_classes()]
