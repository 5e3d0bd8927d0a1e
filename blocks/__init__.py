"""Configuration as Prefect blocks; ``prefect block register -m blocks`` registers every class here.

Each pipeline keeps its own block module in this package (``blocks/<pipeline>.py``); this package imports
them all so one ``register -m blocks`` sees every class. Code reads configuration with ``load_config``:
the saved block (when a Prefect API is configured and the block exists), else the class defaults, then
environment variables on top (``<prefix><FIELD>``), so a deployment can override any field.

The block modules (and Prefect with them) are imported at the first name asked of this package, not at its import:
``blocks.settings`` is read by light processes (the relay, the supervisor, a health check) that never load a block.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

# this folder under another sys.path entry joins the package: a pipeline's modules kept elsewhere (docs/design.md)
__path__ = pkgutil.extend_path(__path__, __name__)

__all__ = ["ConfigBlock", "DynamoTables", "ObjectStorage", "load_config"]
LIGHT_MODULES = ("settings",)  # no block in them, so no Prefect import


def _load_blocks() -> None:
    """Import every pipeline's block module and take its ``__all__`` into this package (once)."""
    if "load_config" in globals():
        return
    from blocks.base import ConfigBlock, load_config
    from blocks.core import DynamoTables, ObjectStorage

    globals().update(ConfigBlock=ConfigBlock, load_config=load_config)
    globals().update(DynamoTables=DynamoTables, ObjectStorage=ObjectStorage)
    for module in pkgutil.iter_modules(__path__):
        if module.name not in ("base", "core", *LIGHT_MODULES):
            imported = importlib.import_module(f"{__name__}.{module.name}")
            for name in getattr(imported, "__all__", []):
                globals()[name] = getattr(imported, name)
                if name not in __all__:
                    __all__.append(name)


def __getattr__(name: str) -> Any:
    """A block class or ``load_config``, imported at the first ask."""
    if name.startswith("__"):
        raise AttributeError(name)
    _load_blocks()
    try:
        return globals()[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    """Every name, the block classes included (``inspect.getmembers`` and `prefect block register` list these)."""
    _load_blocks()
    return sorted(globals())
