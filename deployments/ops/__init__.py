"""Operations CLI subcommands, one module per pipeline; each exposes ``register(subparsers)``."""

from __future__ import annotations

import argparse
import pkgutil

# this folder under another sys.path entry joins the package: a pipeline's modules kept elsewhere (docs/design.md)
__path__ = pkgutil.extend_path(__path__, __name__)


class Parser(argparse.ArgumentParser):
    """The CLI's parser class (its subcommands inherit it): resolves each ``key_argument`` once a command is parsed."""

    def parse_known_args(self, args=None, namespace=None):
        """``argparse``'s parse, then each key taken as positional or flag into its one attribute (or a usage error)."""
        namespace, extras = super().parse_known_args(args, namespace)
        for name, flag in getattr(self, "key_arguments", ()):
            positional, flagged = getattr(namespace, f"{name}_positional"), getattr(namespace, name)
            delattr(namespace, f"{name}_positional")
            if positional is None and flagged is None:
                self.error(f"give {name.upper()} or {flag} {name.upper()}")
            if None not in (positional, flagged) and positional != flagged:
                self.error(f"{name.upper()} {positional!r} and {flag} {flagged!r} differ: give one")
            setattr(namespace, name, flagged if flagged is not None else positional)
        return namespace, extras


def key_argument(parser: argparse.ArgumentParser, name: str, flag: str, help: str | None = None) -> None:
    """Let a command take its one key as ``cmd KEY`` or ``cmd FLAG KEY`` (both only when equal) into ``name``."""
    if not isinstance(parser, Parser):
        raise TypeError(f"key_argument needs a deployments.ops.Parser, not {type(parser).__name__}")
    parser.add_argument(f"{name}_positional", nargs="?", metavar=name.upper(), help=f"{help or name} (or {flag})")
    parser.add_argument(flag, dest=name, metavar=name.upper(), help=f"{help or name}, as a flag")
    parser.key_arguments = [*getattr(parser, "key_arguments", ()), (name, flag)]
