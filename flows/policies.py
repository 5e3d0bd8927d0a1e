"""What every pipeline flow shares: its failure alert and timeout (``pipeline_flow``), its tasks' retries, and the
preamble every flow module needs when it loads (the heartbeat fix, redacted run logs), run by ``pipeline_flow``.

Only the flows import this module (tasks/ stays free of Prefect flow settings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Literal

from prefect import Flow

from tasks.core import limits
from tasks.core.notify import notify_on_failure
from tasks.core.redact import redact_logs
from tasks.core.runtime import quick_heartbeat_exit

Alert = Literal["failed-or-crashed", "crashed"] | None
Hook = Callable[..., None]


def retry_policy(*delays_s: float) -> Mapping[str, Any]:
    """Task options (``task(fn, **policy)``) that retry once per delay, waiting each delay in seconds in turn."""
    return MappingProxyType({"retries": len(delays_s), "retry_delay_seconds": list(delays_s)})


# one call or a few conditional writes: a throttled table, a dropped connection or a busy store clears in seconds
TRANSIENT_RETRIES = retry_policy(2, 10)
# a scan of whole tables, many Prefect API reads or a minutes-long refit: a loaded server or machine needs longer
HEAVY_RETRIES = retry_policy(5, 30)


def _alert_hooks(alert: Alert) -> tuple[list[Hook], list[Hook]]:
    """The notify hooks (on_failure, on_crashed) that ``alert`` asks for."""
    if alert == "failed-or-crashed":
        return [notify_on_failure], [notify_on_failure]
    if alert == "crashed":  # the flow alerts its own failures, with more detail than the hook knows
        return [], [notify_on_failure]
    return [], []  # a subflow: the run that calls it alerts


def pipeline_flow(
    name: str,
    *,
    alert: Alert = "failed-or-crashed",
    on_failure: Iterable[Hook] = (),
    on_crashed: Iterable[Hook] = (),
    flow_class: type[Flow] = Flow,
    **options: Any,
) -> Callable[[Callable[..., Any]], Flow]:
    """``@flow(name=name, ...)`` as the pipelines run it: prints logged, the flow's timeout from ``limits`` (unless
    ``options`` gives one), ``alert``'s notify hooks after the flow's own ``on_failure``/``on_crashed`` hooks;
    ``flow_class`` for a Flow subclass, further ``options`` as ``@flow`` takes them.

    Declaring a flow also runs the flow modules' preamble (once per process): a worker loads a flow's file by path,
    not as a package, and every flow is declared here, so no flow module can load without it."""
    quick_heartbeat_exit()  # sync flow runs end without waiting out the heartbeat thread's sleep
    redact_logs()  # run logs (and Prefect's tracebacks) quote URLs, never their credentials
    alert_on_failure, alert_on_crashed = _alert_hooks(alert)
    options.setdefault("timeout_seconds", limits.flow_timeout(name))
    settings = dict(
        name=name,
        log_prints=True,
        on_failure=[*on_failure, *alert_on_failure],
        on_crashed=[*on_crashed, *alert_on_crashed],
        **options,
    )
    return lambda fn: flow_class(fn, **settings)
