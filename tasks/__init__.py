"""Plain functions (state store, storage, keys, per-pipeline work) that flows wrap as Prefect tasks."""

import pkgutil

# this folder under another sys.path entry joins the package: a pipeline's modules kept elsewhere (docs/design.md)
__path__ = pkgutil.extend_path(__path__, __name__)
