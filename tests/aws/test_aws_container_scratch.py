"""Every container of the template started as ECS starts it on Fargate (tests/helpers/aws_container.py): its
command and environment as the image's user, the root file system read-only, each bind mount a fresh folder
(root's 0755 unless the image declares the path with VOLUME), until its health check passes. A container that
cannot write its scratch folder (HOME, PREFECT_HOME, a listener's heartbeat) never turns healthy, and ECS's
deployment circuit breaker then rolls the stack back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra import cloudformation as cfn
from tests.helpers import aws_container

pytestmark = pytest.mark.sweep  # five containers started at once, each importing Prefect: 30-80 s
HEALTHY_WITHIN_S = 90  # under ECS's 120 s start period
PARAMETERS = {
    "Env": "scratch",
    "BucketName": "pipelines-scratch",
    "ImageTag": "1",
    "AWS::Region": "us-east-1",
    "AWS::AccountId": "123456789012",
    "AWS::URLSuffix": "amazonaws.com",
}


def containers() -> list[dict]:
    """Every container definition of the committed template."""
    template = json.loads(cfn.TEMPLATE_PATH.read_text())
    return [
        container
        for resource in template["Resources"].values()
        if resource["Type"] == "AWS::ECS::TaskDefinition"
        for container in resource["Properties"]["ContainerDefinitions"]
    ]


def stack_parameters() -> dict[str, str]:
    """The template's parameter defaults, this test's values, and the test session's Prefect server."""
    from prefect.settings import PREFECT_API_URL

    template = json.loads(cfn.TEMPLATE_PATH.read_text())
    defaults = {name: p["Default"] for name, p in template["Parameters"].items() if "Default" in p}
    return defaults | PARAMETERS | {"PrefectApiUrl": PREFECT_API_URL.value()}


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_every_container_turns_healthy_as_ecs_runs_it(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("a mount namespace and another uid need root (CI runs as root)")
    if not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("util-linux's unshare and setpriv are missing")
    stage = aws_container.runtime_stage(cfn.REPO_ROOT / "Dockerfile")
    parameters, started = stack_parameters(), {}
    tmp_path.chmod(0o755)  # the container's user reaches its bind mounts' folders through here
    for container in containers():
        name = container["Name"]
        # no AWS here: the task role's credentials stand in as keys that nothing accepts (ECS's own are not in the
        # environment either); the worker's health server gets a free port (others run tests on this host)
        port = str(free_port())
        spec = aws_container.container_spec(
            container,
            parameters,
            stage,
            tmp_path / "mounts",
            log=str(tmp_path / f"{name}.log"),
            timeout_s=HEALTHY_WITHIN_S,
        )
        spec["environment"] |= {"AWS_ACCESS_KEY_ID": "none", "AWS_SECRET_ACCESS_KEY": "none"}
        spec["environment"] |= {"PREFECT_WORKER_WEBSERVER_PORT": port}
        spec["health_check"] = [part.replace(":8080/", f":{port}/") for part in spec["health_check"]]
        (tmp_path / f"{name}.json").write_text(json.dumps(spec))
        driver = [sys.executable, "-m", "tests.helpers.aws_container", str(tmp_path / f"{name}.json")]
        started[name] = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", *driver],
            cwd=cfn.REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(cfn.REPO_ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    assert len(started) >= 2, "the worker and at least one listener"
    outcomes = {}
    for name, process in started.items():
        output, _ = process.communicate(timeout=HEALTHY_WITHIN_S + 60)
        log = Path(tmp_path / f"{name}.log")
        outcomes[name] = (process.returncode, output[-1500:], log.read_text()[-1500:] if log.exists() else "")
    unhealthy = {name: outcome for name, outcome in outcomes.items() if outcome[0] != 0}
    assert not unhealthy, json.dumps(unhealthy, indent=1)
