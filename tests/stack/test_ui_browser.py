"""The Prefect UI, seen in a real browser: a demo run, its logs and its artifacts (progress, chunk table, dashboard).

Skipped when Chromium is absent (`make test` installs Debian's chromium when it can). The ephemeral test
server serves no UI, so this test starts a real `prefect server start` on a free port.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.helpers.prefect_runs import prefect_server_process

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.sweep,
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed"),
]

RUN_DEMO = """
import json, sys
from pathlib import Path
from deployments.samples import phspectra as sample
from flows.phspectra_survey import phspectra_survey
from prefect.runtime import flow_run
params = sample.make(Path(sys.argv[1]))
summary = phspectra_survey(**params)
from flows.health import pipeline_health
pipeline_health()
print("RESULT " + json.dumps({"run_id": summary["run_id"]}))
"""


def _chromium(*args: str, user_dir: str) -> str:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={user_dir}",
        "--window-size=1400,1000",
        "--virtual-time-budget=20000",
    ]
    result = subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True, timeout=180)
    return result.stdout


def _dom_showing(url: str, needles: list[str], *, user_dir: str, attempts: int = 4) -> str:
    """The page's DOM once it shows every needle; a loaded machine may dump the app shell before its route loads."""
    dom = ""
    for _ in range(attempts):
        dom = _chromium("--dump-dom", url, user_dir=user_dir)
        if all(needle in dom for needle in needles):
            break
        time.sleep(2)
    return dom


@pytest.fixture
def ui_server(tmp_path):
    """A real Prefect server with its UI, on a free port, with its own database."""
    with prefect_server_process(tmp_path) as base:
        yield base


def test_the_ui_shows_a_demo_run_its_logs_and_artifacts(ui_server, tables, store_root, tmp_path):
    env = {**os.environ, "PREFECT_API_URL": f"{ui_server}/api", "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", RUN_DEMO, str(tmp_path / "demo")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_id = json.loads(result.stdout.split("RESULT ", 1)[1])["run_id"]

    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with SyncPrefectClient(f"{ui_server}/api") as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["phspectra-survey"])))
    assert len(runs) == 1 and runs[0].state.is_completed()
    flow_run = runs[0]

    out = Path(os.environ.get("TEST_OUTPUT_DIR", REPO_ROOT / "test-output"))
    out.mkdir(parents=True, exist_ok=True)
    user_dir = tempfile.mkdtemp(prefix="chromium-")
    page = f"{ui_server}/runs/flow-run/{flow_run.id}"
    dom = _dom_showing(page, [flow_run.name, f"run {run_id}: 48 spectra in 4 chunks"], user_dir=user_dir)
    assert flow_run.name in dom, "the flow run page does not show the run"
    assert "phspectra-survey" in dom
    assert f"run {run_id}: 48 spectra in 4 chunks" in dom, "the run's log lines are not shown"
    keys = [f"{prefix}-{run_id}" for prefix in ("phspectra-progress", "phspectra-chunks", "phspectra-summary")]
    artifacts = _dom_showing(f"{ui_server}/artifacts", keys, user_dir=user_dir)
    for key in keys:
        assert key in artifacts, f"artifact {key} is not shown"
    chunk_table = f"{ui_server}/artifacts/key/phspectra-chunks-{run_id}"
    title = f"Chunks of run {run_id}"
    assert title in _dom_showing(chunk_table, [title], user_dir=user_dir), "chunk table not shown"
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with SyncPrefectClient(f"{ui_server}/api") as client:
        (board,) = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["pipeline-dashboard"]))
        )
    dashboard = f"{ui_server}/artifacts/artifact/{board.id}"  # the key's page lists versions; this one renders it
    shown = _dom_showing(dashboard, ["Pipelines, last 24 hours", "1 runs"], user_dir=user_dir)
    assert "Pipelines, last 24 hours" in shown and "ETL files tracked per hour" in shown, "dashboard not shown"
    assert "1 runs" in shown, "the dashboard does not count the finished phspectra run"
    _chromium(f"--screenshot={out / 'ui-dashboard.png'}", dashboard, user_dir=user_dir)
    _chromium(f"--screenshot={out / 'ui-flow-run.png'}", page, user_dir=user_dir)
    _chromium(f"--screenshot={out / 'ui-chunk-table.png'}", chunk_table, user_dir=user_dir)
    assert (out / "ui-flow-run.png").stat().st_size > 10_000
