"""GPU node health checks: NVML (nvidia-ml-py), ``dcgmi diag -r N``, or a configured command.

This module imports nothing from the project (only the standard library and, lazily, ``pynvml``), so
``benchmarks/gpu_nvml_check.py`` can run it on a bare GPU machine after ``pip install nvidia-ml-py``.

A check returns a ``HealthResult`` whose ``status`` is ``healthy``, ``unhealthy`` or ``unknown``. A machine
without a GPU or driver gives ``unknown`` with the reason "no GPU: ...", never ``healthy`` by accident.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tasks.core.runtime import now_iso

HEALTHY = "healthy"
UNHEALTHY = "unhealthy"
UNKNOWN = "unknown"

# XIDs that mean the GPU (not the application) is in trouble: double-bit ECC, page retirement /
# row-remapping failures, fallen off the bus, GSP/NVLink fatal errors, contained/uncontained ECC.
CRITICAL_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 123, 140})


@dataclass
class HealthResult:
    """One node's health verdict with the readings behind it."""

    status: str
    method: str
    reason: str
    readings: dict[str, Any] = field(default_factory=dict)
    checked_at: str = ""
    duration_s: float = 0.0

    @property
    def healthy(self) -> bool:
        """Whether the verdict is HEALTHY."""
        return self.status == HEALTHY

    def to_dict(self) -> dict[str, Any]:
        """The result as a plain dict."""
        return asdict(self)

    def to_json(self) -> str:
        """The result as JSON with sorted keys (non-JSON values as strings)."""
        return json.dumps(self.to_dict(), sort_keys=True, default=str)


def _timed(method: str, body) -> HealthResult:
    started = time.monotonic()
    checked_at = now_iso()
    result = body()
    result.method = method
    result.checked_at = checked_at
    result.duration_s = round(time.monotonic() - started, 3)
    return result


# --------------------------------------------------------------------------- NVML


def _nvml_value(fn, *args):
    """A reading, or a short 'n/a: <error>' string when the GPU or driver does not support it."""
    try:
        value = fn(*args)
    except Exception as error:  # noqa: BLE001 - NVMLError_NotSupported and friends: a reading we cannot have
        return f"n/a: {error}"
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value


def _xid_events(pynvml, handles: list, wait_ms: int) -> dict[int, list[int]] | str:
    """Critical XID events seen within ``wait_ms`` per device index (best effort: NVML only reports new events)."""
    try:
        event_set = pynvml.nvmlEventSetCreate()
    except Exception as error:  # noqa: BLE001 - XID events are best effort: any failure reads "n/a"
        return f"n/a: {error}"
    seen: dict[int, list[int]] = {}
    registered: list[int] = []
    try:
        for index, handle in enumerate(handles):
            try:
                pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
                registered.append(index)
            except Exception:  # noqa: BLE001 - a device that cannot report XID events is skipped
                continue
        if not registered:
            return "n/a: XID events not supported"
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            remaining = int((deadline - time.monotonic()) * 1000)
            if remaining <= 0:
                break
            try:
                data = pynvml.nvmlEventSetWait(event_set, remaining)
            except pynvml.NVMLError_Timeout:
                break
            except Exception as error:  # noqa: BLE001 - XID events are best effort: any failure reads "n/a"
                return f"n/a: {error}"
            uuids = [_nvml_value(pynvml.nvmlDeviceGetUUID, h) for h in handles]
            device = _nvml_value(pynvml.nvmlDeviceGetUUID, data.device)
            index = uuids.index(device) if device in uuids else -1
            seen.setdefault(index, []).append(int(data.eventData))
    finally:
        try:
            pynvml.nvmlEventSetFree(event_set)
        except Exception:  # noqa: BLE001 - a failed free must not lose the readings
            pass
    return seen


def read_nvml(xid_wait_ms: int = 1000) -> dict[str, Any]:
    """Every GPU's NVML readings: ECC, row remapping, temperature and thresholds, XID events.

    Raises the NVML error when the library or driver is missing (the caller turns it into "no GPU").
    """
    import pynvml

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        devices = []
        for index, handle in enumerate(handles):
            remap = _nvml_value(pynvml.nvmlDeviceGetRemappedRows, handle)
            devices.append(
                {
                    "index": index,
                    "name": _nvml_value(pynvml.nvmlDeviceGetName, handle),
                    "uuid": _nvml_value(pynvml.nvmlDeviceGetUUID, handle),
                    "temperature_c": _nvml_value(pynvml.nvmlDeviceGetTemperature, handle, pynvml.NVML_TEMPERATURE_GPU),
                    "temperature_slowdown_c": _nvml_value(
                        pynvml.nvmlDeviceGetTemperatureThreshold, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
                    ),
                    "temperature_shutdown_c": _nvml_value(
                        pynvml.nvmlDeviceGetTemperatureThreshold, handle, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
                    ),
                    "ecc_mode": _nvml_value(lambda h: list(pynvml.nvmlDeviceGetEccMode(h)), handle),
                    "ecc_uncorrected_volatile": _nvml_value(
                        pynvml.nvmlDeviceGetTotalEccErrors,
                        handle,
                        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                        pynvml.NVML_VOLATILE_ECC,
                    ),
                    "ecc_uncorrected_aggregate": _nvml_value(
                        pynvml.nvmlDeviceGetTotalEccErrors,
                        handle,
                        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                        pynvml.NVML_AGGREGATE_ECC,
                    ),
                    "remapped_rows": (
                        dict(zip(("correctable", "uncorrectable", "pending", "failed"), remap))
                        if isinstance(remap, tuple)
                        else remap
                    ),
                }
            )
        return {
            "driver_version": _nvml_value(pynvml.nvmlSystemGetDriverVersion),
            "nvml_version": _nvml_value(pynvml.nvmlSystemGetNVMLVersion),
            "device_count": count,
            "devices": devices,
            "xid_critical_events": _xid_events(pynvml, handles, xid_wait_ms),
        }
    finally:
        pynvml.nvmlShutdown()


def judge_nvml(readings: dict[str, Any]) -> tuple[str, str]:
    """(status, reason) from NVML readings: any uncorrected volatile ECC error, pending or failed row
    remapping, critical XID, or temperature at the slowdown threshold makes the node unhealthy."""
    if not readings.get("device_count"):
        return UNKNOWN, "no GPU: NVML found 0 devices"
    problems = []
    for device in readings["devices"]:
        label = f"GPU {device['index']}"
        ecc = device.get("ecc_uncorrected_volatile")
        if isinstance(ecc, int) and ecc > 0:
            problems.append(f"{label}: {ecc} uncorrected ECC errors since boot")
        remap = device.get("remapped_rows")
        if isinstance(remap, dict):
            if remap.get("pending"):
                problems.append(f"{label}: row remapping pending (reset needed)")
            if remap.get("failed"):
                problems.append(f"{label}: row remapping failed")
        temp, slowdown = device.get("temperature_c"), device.get("temperature_slowdown_c")
        if isinstance(temp, int) and isinstance(slowdown, int) and temp >= slowdown:
            problems.append(f"{label}: temperature {temp} C at or above slowdown {slowdown} C")
    xids = readings.get("xid_critical_events")
    if isinstance(xids, dict):
        for index, codes in xids.items():
            critical = sorted(set(codes) & CRITICAL_XIDS)
            if critical:
                problems.append(f"GPU {index}: critical XID {critical}")
    if problems:
        return UNHEALTHY, "; ".join(problems)
    return HEALTHY, f"{readings['device_count']} GPU(s) passed ECC, row-remapping, XID and temperature checks"


def nvml_check(xid_wait_ms: int = 1000) -> HealthResult:
    """The NVML check; "no GPU" (unknown) when the library or driver is missing."""

    def body() -> HealthResult:
        """Read NVML and judge the readings; unknown when NVML is missing or errors."""
        try:
            import pynvml
        except ImportError:
            return HealthResult(UNKNOWN, "nvml", "no GPU: nvidia-ml-py (pynvml) is not installed")
        try:
            readings = read_nvml(xid_wait_ms)
        except (pynvml.NVMLError_LibraryNotFound, pynvml.NVMLError_DriverNotLoaded) as error:
            return HealthResult(UNKNOWN, "nvml", f"no GPU: {type(error).__name__}: {error}")
        except pynvml.NVMLError as error:
            return HealthResult(UNKNOWN, "nvml", f"NVML error: {type(error).__name__}: {error}")
        status, reason = judge_nvml(readings)
        return HealthResult(status, "nvml", reason, readings)

    return _timed("nvml", body)


# --------------------------------------------------------------------------- DCGM and commands


def _run(argv: list[str], timeout_s: float, env: dict[str, str] | None = None) -> tuple[int | None, str, str]:
    """(exit code or None on timeout, stdout, stderr) of a command run without a shell."""
    full_env = {**os.environ, **env} if env else None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=full_env)
    except subprocess.TimeoutExpired as error:
        return None, str(error.stdout or ""), f"timed out after {timeout_s} s"
    return done.returncode, done.stdout, done.stderr


def dcgmi_check(level: int = 1, timeout_s: float = 900) -> HealthResult:
    """``dcgmi diag -r {level} -j``: exit 0 and no failed test is healthy; dcgmi missing is unknown."""

    def body() -> HealthResult:
        """Run ``dcgmi diag`` and judge its exit code and JSON output."""
        if shutil.which("dcgmi") is None:
            return HealthResult(UNKNOWN, "dcgmi", "no DCGM: dcgmi is not installed on this node")
        code, out, err = _run(["dcgmi", "diag", "-r", str(int(level)), "-j"], timeout_s)
        readings: dict[str, Any] = {"exit_code": code, "stderr": err[-2000:]}
        try:
            readings["diag"] = json.loads(out) if out.strip() else None
        except json.JSONDecodeError:
            readings["stdout"] = out[-4000:]
        if code is None:
            return HealthResult(UNHEALTHY, "dcgmi", f"dcgmi diag -r {level} timed out", readings)
        failed = '"Fail"' in out or '"fail"' in out
        if code == 0 and not failed:
            return HealthResult(HEALTHY, "dcgmi", f"dcgmi diag -r {level} passed", readings)
        return HealthResult(UNHEALTHY, "dcgmi", f"dcgmi diag -r {level} failed (exit {code})", readings)

    return _timed("dcgmi", body)


def command_check(command: str | list[str], timeout_s: float = 300, env: dict[str, str] | None = None) -> HealthResult:
    """A configured command: exit 0 healthy, non-zero or timeout unhealthy, cannot start unknown."""

    def body() -> HealthResult:
        """Run the health command and judge it by its exit code."""
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            return HealthResult(UNKNOWN, "command", "no health command configured")
        try:
            code, out, err = _run(argv, timeout_s, env)
        except (OSError, ValueError) as error:
            return HealthResult(UNKNOWN, "command", f"health command cannot start: {error}", {"argv": argv})
        readings = {"argv": argv, "exit_code": code, "stdout": out[-2000:], "stderr": err[-2000:]}
        if code == 0:
            return HealthResult(HEALTHY, "command", "health command exited 0", readings)
        what = "timed out" if code is None else f"exited {code}"
        return HealthResult(UNHEALTHY, "command", f"health command {what}", readings)

    return _timed("command", body)


def run_check(
    method: str, command: str | list[str] | None = None, dcgm_level: int = 1, timeout_s: float = 900
) -> HealthResult:
    """The check named ``method`` ("nvml", "dcgmi" or "command") on this machine."""
    if method == "nvml":
        return nvml_check()
    if method == "dcgmi":
        return dcgmi_check(dcgm_level, timeout_s)
    if method == "command":
        return command_check(command or [], timeout_s)
    raise ValueError(f"unknown health check {method!r}: use 'nvml', 'dcgmi' or 'command'")
