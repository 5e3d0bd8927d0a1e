"""Sample data for `make demo`, a module per pipeline; each exposes ``make(workdir) -> parameters``, ``report(...)``."""
