"""Loading configuration blocks with environment overrides."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar, get_args, get_origin

from prefect.blocks.core import Block

DEFAULT_BLOCK_NAME = "default"
B = TypeVar("B", bound="ConfigBlock")
logger = logging.getLogger(__name__)


class ConfigBlock(Block):
    """A block whose scalar fields can be overridden by environment variables ``<_env_prefix><FIELD>``.

    Each pipeline's block has its own prefix (``ETL_``, ``GPU_``, ...), so its names cannot collide with another
    tool's. ``_env_aliases`` lists other names a field is also read from (a seed's own variable names, each spelled
    out): the prefixed name wins when both are set, and a warning says so when they disagree."""

    _env_prefix: ClassVar[str] = ""
    _env_aliases: ClassVar[Mapping[str, str]] = {}  # alias variable name -> the field it sets

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable that overrides ``field``: ``<_env_prefix><FIELD>``."""
        return f"{cls._env_prefix}{field}".upper()

    @classmethod
    def env_raw(cls, field: str) -> str | None:
        """The text the environment sets ``field`` to: its prefixed name, else its alias, else None."""
        raw = os.environ.get(cls.env_name(field))
        for alias in (alias for alias, target in cls._env_aliases.items() if target == field):
            aliased = os.environ.get(alias)
            if aliased is None:
                continue
            if raw is None:
                return aliased
            if aliased != raw:
                logger.warning("%s=%r wins over its alias %s=%r", cls.env_name(field), raw, alias, aliased)
        return raw

    @classmethod
    def env_overrides(cls) -> dict[str, Any]:
        """Field values set in the environment, converted to the field's type."""
        values: dict[str, Any] = {}
        for name, info in cls.model_fields.items():
            raw = cls.env_raw(name)
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
