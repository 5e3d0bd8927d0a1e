"""Loading configuration blocks with environment overrides."""

from __future__ import annotations

import functools
from typing import Any, ClassVar, TypeVar, get_args, get_origin

from prefect.blocks.core import Block
from pydantic import SecretStr

from blocks.settings import BlockLoading, EnvNames, env_prefix

DEFAULT_BLOCK_NAME = "default"
B = TypeVar("B", bound="ConfigBlock")


class ConfigBlock(EnvNames, Block):
    """A block whose scalar fields can be overridden by environment variables ``<_env_prefix><FIELD>``.

    Each pipeline's block has its own prefix, derived by ``blocks.settings.env_prefix`` (``blocks/etl.py`` ->
    ``ETL_``; a class may declare ``_env_scope``), so its names cannot collide with another tool's. ``_env_aliases``
    lists other names a field is also read from (a seed's own variable names, each spelled out): the prefixed name
    wins when both are set, and a warning says so when they disagree. ``_env_patterns`` documents names with a
    variable part (``TABLE_<LOGICAL>``), read with ``read_pattern``."""

    _env_prefix: ClassVar[str] = ""  # set for each subclass from the rule, never by hand

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._env_prefix = env_prefix(cls)

    @classmethod
    def env_type(cls, field: str) -> type | None:
        """The type ``field``'s variable is read as (a list reads as text, split by its validator); None: no
        variable sets it (a nested block, a mapping): only the saved block does."""
        annotation = cls.model_fields[field].annotation
        if get_origin(annotation) is dict:
            return None
        if get_origin(annotation) is not None:  # Optional[X] -> X; Literal[...] and list[str] -> str
            args = [a for a in get_args(annotation) if a is not type(None)]
            annotation = args[0] if len(args) == 1 else str
        return annotation if annotation in (bool, int, float, str, SecretStr) else None

    @classmethod
    def env_overrides(cls) -> dict[str, Any]:
        """Field values set in the environment, converted to the field's type."""
        values: dict[str, Any] = {}
        for name in cls.model_fields:
            kind = cls.env_type(name)
            raw = cls.env_raw(name) if kind is not None else None
            if raw is None:
                continue
            if kind is bool:
                values[name] = raw.strip().lower() in ("1", "true", "yes", "on")
            elif kind is SecretStr:
                values[name] = SecretStr(raw)
            else:
                values[name] = kind(raw)
        return values


@functools.cache
def _saved_block(cls: type[ConfigBlock], name: str) -> ConfigBlock | None:
    """The saved block, or None when there is no API to ask or no such block (cached per process)."""
    if not BlockLoading.read().use_blocks:
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
