"""Operations CLI subcommands, one module per pipeline; each exposes ``register(subparsers)``."""
