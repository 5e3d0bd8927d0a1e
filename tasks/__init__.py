"""Plain functions (state store, storage, keys, per-pipeline work) that flows wrap as Prefect tasks."""
