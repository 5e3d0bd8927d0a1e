"""An upgrade in place, as an operator does it: a stack of a previous release (a git worktree of its commit, from
releases.json and this clone's history, no tag needed) up on free ports in a data folder of its own, fed ETL files,
videos, records and cubes; mid-feed, `git checkout` of this commit and that stack's `up`. Then every file is merged
once, every granule, video and cube done, the Prefect server's history kept (the runs from before the swap still
listed) and the listeners' watermarks read (each landing place's watermark moves on after the swap, and nothing is
offered twice). Measured: how long the stack's doors did not answer, and the landed files' latency before, around
and after the swap."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from deployments import dynamodb_local, releases
from deployments.supervisor import Supervisor, socket_for

pytestmark = pytest.mark.sweep  # two whole stacks, each fed for minutes

REPO_ROOT = Path(__file__).resolve().parents[2]
FEED_S = 150  # the feed's length; the swap starts SWAP_AT_S into it, or once the old stack has done work
SWAP_AT_S = 35
SWAP_WAIT_S = 180  # at most this much longer, for the old stack's first merged file and written granule
DRAIN_S = 240


def _git(*args: str, cwd: Path = REPO_ROOT) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def _stack(command: str, tree: Path, env: dict[str, str]) -> tuple[str, float]:
    """``local_stack COMMAND`` of the checkout ``tree`` (its own code, the shared venv); its output and seconds."""
    began = time.monotonic()
    result = subprocess.run(
        [str(tree / ".venv" / "bin" / "python"), "-m", "deployments.local_stack", command],
        cwd=tree,
        env={**env, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(f"local_stack {command} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout, time.monotonic() - began


class Doors:
    """Every half second: whether the Prefect API answers its health check and DynamoDB's port accepts; the spans
    either did not (the stack's unavailability)."""

    def __init__(self, data: Path, ports: dict[str, int]) -> None:
        self.data, self.ports = data, ports
        self.down: dict[str, list[list[float]]] = {"prefect": [], "dynamodb": []}
        self.stop = threading.Event()

    def _prefect(self) -> bool:
        certificate = self.data / "secrets" / "prefect-api.crt"
        for scheme in ("https", "http"):  # v0.1.0's API is plain http
            if scheme == "https" and not certificate.exists():
                continue
            context = ssl.create_default_context(cafile=str(certificate)) if scheme == "https" else None
            url = f"{scheme}://127.0.0.1:{self.ports['prefect-server']}/api/health"
            with contextlib.suppress(OSError, ssl.SSLError):
                with urllib.request.urlopen(url, timeout=2, context=context) as response:
                    return response.status == 200
        return False

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.monotonic()
            answers = {
                "prefect": self._prefect(),
                "dynamodb": dynamodb_local.port_open("127.0.0.1", self.ports["dynamodb"]),
            }
            for door, up in answers.items():
                spans = self.down[door]
                if not up and (not spans or spans[-1][1] is not None):
                    spans.append([now, None])
                elif up and spans and spans[-1][1] is None:
                    spans[-1][1] = now
            self.stop.wait(0.5)

    def seconds_down(self) -> dict[str, float]:
        end = time.monotonic()
        return {door: round(sum((b or end) - a for a, b in spans), 1) for door, spans in self.down.items()}


def _flow_run_ids(data: Path) -> set[str]:
    """Every flow run the stack's server lists that has started (its history; a schedule's future runs are the
    scheduler's to replace when `prefect deploy` updates the schedule)."""
    from tests.helpers.upgrade_feed import run_in_stack

    code = (
        "from prefect.client.orchestration import get_client\n"
        "with get_client(sync_client=True) as c:\n"
        "    ids, offset = [], 0\n"
        "    while True:\n"
        "        page = c.read_flow_runs(limit=200, offset=offset)\n"
        "        ids += [str(r.id) for r in page if r.state_type is None or r.state_type.value != 'SCHEDULED']\n"
        "        offset += 200\n"
        "        if len(page) < 200: break\n"
        "print('\\n'.join(ids))\n"
    )
    return set(run_in_stack(data, code, check=True).stdout.split())


def _watermarks(objects: Path) -> dict[str, float]:
    """Each landing place's catch-up watermark (the time it says), by folder."""
    from tasks.landing.watch import WATERMARK_NAME

    return {
        str(p.parent.relative_to(objects)): float(json.loads(p.read_text())["watermark"])
        for p in objects.rglob(WATERMARK_NAME)
    }


def _latencies(ledger: dict, around: tuple[float, float]) -> dict[str, float | int]:
    """Arrival → done p50/p95 (s) of the items that arrived before, during and after ``around`` (epoch seconds)."""
    groups: dict[str, list[float]] = {"before": [], "around": [], "after": []}
    for item, arrived in ledger["arrived"].items():
        if item in ledger["done"]:
            when = "before" if arrived < around[0] else "around" if arrived <= around[1] else "after"
            groups[when].append(ledger["done"][item] - arrived)
    figures: dict[str, float | int] = {}
    for when, values in groups.items():
        values.sort()
        if values:
            figures[f"{when}_p50"] = round(values[len(values) // 2], 1)
            figures[f"{when}_p95"] = round(values[min(len(values) - 1, int(len(values) * 0.95))], 1)
        figures[f"{when}_n"] = len(values)
    return figures


@pytest.mark.timeout(1500)
@pytest.mark.parametrize("release", ["0.2.0", "0.1.0"])
def test_git_pull_and_up_mid_feed_loses_and_duplicates_nothing(release):
    commit = releases.release_commit(release)
    head = _git("rev-parse", "HEAD")
    if subprocess.run(["git", "-C", str(REPO_ROOT), "merge-base", "--is-ancestor", commit, head]).returncode != 0:
        pytest.skip(f"v{release} ({commit[:7]}) is not in this clone's history (a shallow clone)")
    folder = Path(tempfile.mkdtemp(prefix=f"upgrade-{release}-"))
    folder.chmod(0o755)  # PostgreSQL (as root: the `postgres` user) reaches its folder under it
    tree, data, work = folder / "checkout", folder / "data", folder / "work"
    work.mkdir()
    _git("worktree", "add", "--detach", str(tree), commit)
    for shared in (".venv", "node_modules"):  # the same venv serves the old code (brief: the pins did not change)
        (tree / shared).symlink_to((REPO_ROOT / shared).resolve())
    ports = {name: dynamodb_local.free_port() for name in ("dynamodb", "prefect-server", "postgres")}
    env = {
        "PATH": os.environ["PATH"],
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "PIPELINES_DATA_DIR": str(data),
        "DYNAMODB_LOCAL_PORT": str(ports["dynamodb"]),
        "PREFECT_SERVER_PORT": str(ports["prefect-server"]),
        "PREFECT_POSTGRES_PORT": str(ports["postgres"]),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "AWS_ACCESS_KEY_ID": "local",  # v0.1.0's Makefile exported these; later stacks hand their own key
        "AWS_SECRET_ACCESS_KEY": "local",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    doors = Doors(data, ports)
    feed = None
    try:
        _, old_up_s = _stack("up", tree, env)
        threading.Thread(target=doors.run, daemon=True).start()
        out, feed_log = folder / "feed.json", Path(os.environ.get("UPGRADE_FEED_LOG") or folder / "feed.log")
        feed = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.upgrade_feed", "--data", str(data), "--work", str(work)]
            + ["--feed-s", str(FEED_S), "--drain-s", str(DRAIN_S), "--out", str(out)],
            cwd=REPO_ROOT,
            env={**env, "PYTHONPATH": str(REPO_ROOT)},
            stdout=feed_log.open("w"),
            stderr=subprocess.STDOUT,
        )
        time.sleep(SWAP_AT_S)
        progress = folder / "progress.json"
        deadline = time.monotonic() + SWAP_WAIT_S  # the swap comes once the old stack finishes work (runs in flight)
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if all(json.loads(progress.read_text()).get(p) for p in ("etl", "records")):
                    break
            time.sleep(2)
        runs_before = _flow_run_ids(data)
        marks_before = _watermarks(data / "objects")
        swap_began = time.time()
        _git("checkout", "--detach", head, cwd=tree)  # the `git pull`
        up_output, up_s = _stack("up", tree, env)
        swap_ended = time.time()
        feed.wait(timeout=FEED_S + DRAIN_S + 300)
        assert feed.returncode == 0, feed_log.read_text()[-3000:]
        result = json.loads(out.read_text())
        doors.stop.set()

        # the operator was told which release wrote the data, and the stack now says this one
        assert f"written by v{release}" in up_output, up_output
        assert releases.read_stamp(data) == releases.VERSION
        status, _ = _stack("status", tree, env)
        supervisor = Supervisor(data, socket_for(data))
        programs = {info["name"]: info for info in supervisor.statuses()}
        assert all(info["statename"] == "RUNNING" for info in programs.values()), status
        assert all(info["start"] >= swap_began - 1 for info in programs.values() if info["name"] != "postgres"), (
            "every program of the stack's own code runs the new code (restarted by the up)",
            {name: info["start"] for name, info in programs.items()},
        )

        # nothing lost, nothing duplicated
        for pipeline in ("etl", "video", "records", "phspectra"):
            ledger = result[pipeline]
            assert ledger["arrived"], f"{pipeline}: nothing was fed"
            assert not ledger["failed"], (pipeline, ledger["failed"])
            assert set(ledger["done"]) == set(ledger["arrived"]), (
                pipeline,
                set(ledger["arrived"]) - set(ledger["done"]),
            )
        duplicates = result["etl_duplicates"]
        assert duplicates["files_in_two_manifests"] == 0 and duplicates["rows"] == duplicates["expected_rows"], (
            duplicates
        )

        # the server's history kept, the watermarks read (moved on from where the old listeners left them)
        assert runs_before and runs_before <= _flow_run_ids(data)
        marks_after = _watermarks(data / "objects")
        assert marks_before and all(marks_after.get(place, 0.0) > mark for place, mark in marks_before.items()), (
            marks_before,
            marks_after,
        )

        figures = {
            "release": release,
            "old up s": round(old_up_s, 1),
            "upgrade up s": round(up_s, 1),
            "doors down s": doors.seconds_down(),
            "etl latency s": _latencies(result["etl"], (swap_began, swap_ended)),
            "files": len(result["etl"]["arrived"]),
        }
        print(f"upgrade in place: {json.dumps(figures)}")
    finally:
        doors.stop.set()
        if feed is not None and feed.poll() is None:
            feed.kill()
        with contextlib.suppress(Exception):
            _stack("down", tree, env)
        with contextlib.suppress(Exception):
            _git("worktree", "remove", "--force", str(tree))
        shutil.rmtree(folder, ignore_errors=True)
