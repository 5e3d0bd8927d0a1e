"""Configuration as Prefect blocks; ``prefect block register -m blocks`` registers every class here.

Each pipeline keeps its own block module in this package (``blocks/<pipeline>.py``); this package imports
them all so one ``register -m blocks`` sees every class. Code reads configuration with ``load_config``:
the saved block (when a Prefect API is configured and the block exists), else the class defaults, then
environment variables on top (``<prefix><FIELD>``), so a deployment can override any field.
"""

from __future__ import annotations

import importlib
import pkgutil

# this folder under another sys.path entry joins the package: a pipeline's modules kept elsewhere (docs/design.md)
__path__ = pkgutil.extend_path(__path__, __name__)

from blocks.base import ConfigBlock, load_config
from blocks.core import DynamoTables, ObjectStorage

__all__ = ["ConfigBlock", "DynamoTables", "ObjectStorage", "load_config"]

# import every pipeline's block module so `prefect block register -m blocks` finds its classes
for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("base", "core"):
        _mod = importlib.import_module(f"{__name__}.{_module.name}")
        for _name in getattr(_mod, "__all__", []):
            globals()[_name] = getattr(_mod, _name)
            __all__.append(_name)
