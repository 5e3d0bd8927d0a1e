"""Sample data for `make demo`, a module per pipeline (``deployments/samples/<name>.py``, found by its registered name).

Each exposes ``make(workdir) -> parameters`` and ``report(**parameters)``; a landed pipeline's also ``drop(workdir,
store)`` and ``landed(**parameters)`` (and ``FOLLOW_UPS``, deployments to run once it landed); one with no landing
names the ``DEPLOYMENT`` the demo runs.
"""

import pkgutil

# this folder under another sys.path entry joins the package: a pipeline's modules kept elsewhere (docs/design.md)
__path__ = pkgutil.extend_path(__path__, __name__)
