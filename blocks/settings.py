"""The one rule every setting's environment name follows, and ``EnvSettings`` for the process-level settings.

A settings class's variables are ``<SCOPE>_<FIELD>``: its scope is the package that owns it (``blocks/etl.py`` and
``tasks/etl/…`` -> ``etl``) unless the class declares ``_env_scope`` (``pipelines`` for the machine's settings, or a
block's own word such as ``video_inference``). A name that existed before the rule stays readable as a declared alias.
``deployments/settings_tree.py`` lists every class; docs/operations.md's configuration tables are rendered from it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field

logger = logging.getLogger(__name__)
OWNING_PACKAGES = ("blocks", "tasks")  # a module under one of these is owned by its next package: blocks.etl -> etl


def env_prefix(cls: type) -> str:
    """``<SCOPE>_``: the class's ``_env_scope``, else the package that owns its module, upper-cased."""
    scope = getattr(cls, "_env_scope", None)
    if not scope:
        parts = cls.__module__.split(".")
        if parts[0] not in OWNING_PACKAGES or len(parts) < 2:
            raise TypeError(f"{cls.__module__}.{cls.__name__} sits outside blocks/ and tasks/: declare _env_scope")
        scope = parts[1]
    return f"{scope}_".upper()


def read_env(name: str, aliases: tuple[str, ...] = ()) -> str | None:
    """The text of variable ``name``, else of its first alias set; the name wins, with a warning when they differ."""
    raw = os.environ.get(name)
    for alias in aliases:
        aliased = os.environ.get(alias)
        if aliased is None:
            continue
        if raw is None:
            return aliased
        if aliased != raw:
            logger.warning("%s=%r wins over its alias %s=%r", name, raw, alias, aliased)
    return raw


class EnvNames:
    """The environment names of a settings class: ``<SCOPE>_<FIELD>``, its aliases and its patterns."""

    _env_scope: ClassVar[str | None] = None
    _env_aliases: ClassVar[Mapping[str, str]] = {}  # a name read before the rule -> the field it sets
    # names with a variable part, e.g. "<PIPELINE>_QUEUE_URL" -> what it sets (read with ``read_pattern``)
    _env_patterns: ClassVar[Mapping[str, str]] = {}

    @classmethod
    def env_name(cls, field: str) -> str:
        """The variable that sets ``field``: ``<SCOPE>_<FIELD>``."""
        return f"{env_prefix(cls)}{field}".upper()

    @classmethod
    def env_raw(cls, field: str) -> str | None:
        """The text the environment sets ``field`` to: its name, else an alias, else None."""
        return read_env(cls.env_name(field), tuple(a for a, target in cls._env_aliases.items() if target == field))

    @classmethod
    def pattern_name(cls, part: str) -> str:
        """The variable ``<SCOPE>_<PART>`` of one of ``_env_patterns`` (``part`` with its variable filled in)."""
        return f"{env_prefix(cls)}{part}".upper()

    @classmethod
    def read_pattern(cls, part: str) -> str | None:
        """The text of ``pattern_name(part)``; None when unset or empty."""
        return read_env(cls.pattern_name(part)) or None


class EnvSettings(EnvNames, BaseModel):
    """Settings of a process, not of a saved block: each field read from ``<SCOPE>_<FIELD>`` whenever ``read()`` is
    called (tests and deployments change the environment between calls); an empty variable counts as unset."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def read(cls) -> Self:
        """The settings as the environment holds them now (the defaults where unset)."""
        values: dict[str, Any] = {}
        for field in cls.model_fields:
            raw = cls.env_raw(field)
            if raw:
                values[field] = raw
        return cls(**values)


class BlockLoading(EnvSettings):
    """Whether ``load_config`` asks the Prefect API for saved blocks."""

    _env_scope: ClassVar[str] = "pipelines"

    use_blocks: bool = Field(
        default=True,
        description="Read saved blocks from the Prefect API; 0: the class defaults and the environment only.",
    )
