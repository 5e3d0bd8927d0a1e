"""Sample data for `make demo`, one module per pipeline; each exposes ``make(workdir) -> parameters`` and ``report(...)``."""
