"""Loading configuration blocks with environment overrides."""

from __future__ import annotations

import functools
import os
from typing import Any, ClassVar, TypeVar, get_args, get_origin

from prefect.blocks.core import Block

DEFAULT_BLOCK_NAME = "default"
B = TypeVar("B", bound="ConfigBlock")


class ConfigBlock(Block):
    """A block whose scalar fields can be overridden by environment variables ``<_env_prefix><FIELD>``."""

    _env_prefix: ClassVar[str] = ""

    @classmethod
    def env_overrides(cls) -> dict[str, Any]:
        """Field values set in the environment, converted to the field's type."""
        values: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            raw = os.environ.get(f"{cls._env_prefix}{name}".upper())
            if raw is None:
                continue
            annotation = info.annotation
            if get_origin(annotation) is not None:  # Optional[X] -> X
                args = [a for a in get_args(annotation) if a is not type(None)]
                annotation = args[0] if len(args) == 1 else str
            if annotation is bool:
                values[name] = raw.strip().lower() in ("1", "true", "yes", "on")
            elif annotation in (int, float, str):
                values[name] = annotation(raw)
        return values


@functools.cache
def _saved_block(cls: type[ConfigBlock], name: str) -> ConfigBlock | None:
    """The saved block, or None when there is no API to ask or no such block (cached per process)."""
    if os.environ.get("PIPELINES_USE_BLOCKS", "1") == "0":
        return None
    from prefect.settings import get_current_settings

    if not get_current_settings().api.url:  # no server configured: don't start an ephemeral one
        return None
    try:
        return cls.load(name, validate=False)
    except (ValueError, KeyError):  # not registered or not saved
        return None
    except Exception as error:  # noqa: BLE001 - API unreachable (any client error): the defaults still work, but say so
        import logging

        logging.getLogger(__name__).warning(
            "could not load block %s/%s (%s); using defaults", cls.__name__, name, error
        )
        return None


def load_config(cls: type[B], name: str = DEFAULT_BLOCK_NAME) -> B:
    """The block named ``name`` (or the defaults) with environment overrides applied."""
    saved = _saved_block(cls, name)
    base = saved.model_dump(exclude={"block_document_id", "block_document_name"}) if saved is not None else {}
    # keep nested blocks (credentials) as objects, not dicts
    if saved is not None:
        for field_name in cls.model_fields:
            value = getattr(saved, field_name, None)
            if isinstance(value, Block):
                base[field_name] = value
    base.update(cls.env_overrides())
    return cls(**base)


def clear_cache() -> None:
    """Forget saved blocks read so far (tests, or after `make up` saved new ones)."""
    _saved_block.cache_clear()
