"""The local worker's engine fork server (`deployments/engine_forkserver.py`) on the session's Prefect server: a run
started through it sees its own environment, settings, folder and streams, logs to the API and exits as the engine
did; a killed run command takes its run with it; SIGTERM reaches the run; with no server the engine runs directly."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from deployments import local_stack
from tests.helpers.prefect_runs import api_url, flow_run_state, fork_server_process, wait_for_json

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

FORKSERVER = str(local_stack.FORKSERVER)
PROBE_FLOW = """
import json, os, sys, time
from pathlib import Path
from prefect import flow
from prefect.settings import get_current_settings


@flow(log_prints=True)
def probe(out: str, sleep_s: float = 0.0) -> int:
    Path(out).write_text(json.dumps({
        "pid": os.getpid(), "env": os.environ.get("FORK_PROBE"), "cwd": os.getcwd(), "path": sys.path,
        "level": get_current_settings().logging.level, "av_loaded": "av" in sys.modules,
    }))
    print("probe says hello")
    time.sleep(sleep_s)
    print("probe says goodbye")
    return 1
"""


@pytest.fixture
def probe_deployment(tmp_path):
    """A process-pool deployment of the probe flow (a file of the test's own); a function making a run of it."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    source = tmp_path / "source"
    source.mkdir()
    (source / "probe.py").write_text(PROBE_FLOW)
    pool = f"fork-{uuid.uuid4().hex[:8]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=pool, type="process"))
    deployment_id = flow.from_source(str(source), "probe.py:probe").deploy(
        name="fork", work_pool_name=pool, print_next_steps=False
    )

    def new_run(out: Path, sleep_s: float = 0.0) -> str:
        with get_client(sync_client=True) as client:
            return str(
                client.create_flow_run_from_deployment(
                    deployment_id, parameters={"out": str(out), "sleep_s": sleep_s}
                ).id
            )

    return new_run


@pytest.fixture
def fork_server(tmp_path):
    """A fork server with no worker beside it, started with the environment a worker has; its socket path."""
    sock = str(tmp_path / "engine.sock")
    with fork_server_process(FORKSERVER, sock):
        yield sock


def start_run(sock: str, flow_run_id: str, cwd: Path, **env: str) -> subprocess.Popen:
    """What the process worker does: the pool's command, with the run's id and environment, in its folder."""
    run_env = {**os.environ, "PREFECT_API_URL": api_url(), "PREFECT__FLOW_RUN_ID": flow_run_id, **env}
    return subprocess.Popen(
        [sys.executable, FORKSERVER, "run", sock],
        env=run_env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def mark_crashed(flow_run_id: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        client.set_flow_run_state(uuid.UUID(flow_run_id), Crashed(message="its process was killed"), force=True)


def gone(pid: int, seconds: float = 10) -> bool:
    from tasks.core.processes import pid_alive

    deadline = time.monotonic() + seconds
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_run_through_the_fork_server_has_its_own_environment_settings_folder_and_logs(
    fork_server, probe_deployment, tmp_path
):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    run_id = probe_deployment(tmp_path / "probe.json")
    command = start_run(fork_server, run_id, tmp_path, FORK_PROBE="run-42", PREFECT_LOGGING_LEVEL="DEBUG")
    stdout, stderr = command.communicate(timeout=120)
    assert command.returncode == 0, stderr[-3000:]
    seen = wait_for_json(tmp_path / "probe.json")
    assert seen["pid"] != command.pid  # a fork of the server, not the command's own process
    assert (seen["env"], seen["level"]) == ("run-42", "DEBUG")  # the run's environment and settings, not the server's
    assert seen["av_loaded"]  # PyAV comes preloaded: a video run's first probe does not import it
    assert seen["cwd"] == str(tmp_path / "source")  # the pull step's folder
    assert str(tmp_path) in seen["path"] and str(local_stack.REPO_ROOT / "deployments") not in seen["path"]  # as -m's
    assert "probe says hello" in stdout + stderr  # the run's streams are the command's
    assert flow_run_state(run_id).is_completed()
    with get_client(sync_client=True) as client:  # logs flushed to the API at the child's exit
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[uuid.UUID(run_id)])))
    assert any(log.message == "probe says hello" for log in logs)


def test_a_failing_engine_exits_the_run_command_with_its_code_and_message(fork_server, tmp_path):
    command = start_run(fork_server, "not-a-uuid", tmp_path)
    _, stderr = command.communicate(timeout=60)
    assert command.returncode == 1 and "Invalid flow run id" in stderr


def test_killing_the_run_command_kills_its_run_at_once(fork_server, probe_deployment, tmp_path):
    run_id = probe_deployment(tmp_path / "probe.json", sleep_s=300)
    command = start_run(fork_server, run_id, tmp_path)
    child = wait_for_json(tmp_path / "probe.json")["pid"]
    command.kill()  # SIGKILL: the worker's hard kill; nothing of the command's own runs
    command.wait()
    assert gone(child)  # no flow run outlives the process its worker watches
    mark_crashed(run_id)  # what the worker does when its process is killed (else later tests find it Running)


def test_a_run_outlives_the_worker_that_read_its_output(fork_server, probe_deployment, tmp_path):
    """The worker dies (SIGKILL): the pipes it read its runs' output from have no reader. The run, a fork of the
    server, logs on and completes (its logs reach the API), its output beyond that point dropped."""
    out = tmp_path / "probe.json"
    flow_run_id = probe_deployment(out, sleep_s=2.0)
    command = start_run(fork_server, flow_run_id, tmp_path)
    wait_for_json(out)
    command.stdout.close()  # what the worker's death does to the pipes' reading ends
    command.stderr.close()
    assert command.wait(60) == 0
    assert flow_run_state(flow_run_id).is_completed(), flow_run_state(flow_run_id)


def test_sigterm_to_the_run_command_reaches_the_run_and_the_command_ends_as_it_did(
    fork_server, probe_deployment, tmp_path
):
    run_id = probe_deployment(tmp_path / "probe.json", sleep_s=300)
    command = start_run(fork_server, run_id, tmp_path)
    child = wait_for_json(tmp_path / "probe.json")["pid"]
    command.send_signal(signal.SIGTERM)  # the worker's graceful kill of a cancelled run
    command.communicate(timeout=60)
    assert gone(child)
    assert command.returncode != 0
    assert not flow_run_state(run_id).is_running()


def test_with_no_fork_server_the_run_command_runs_the_engine_itself(probe_deployment, tmp_path):
    run_id = probe_deployment(tmp_path / "probe.json")
    command = start_run(str(tmp_path / "no-server.sock"), run_id, tmp_path, FORK_PROBE="direct")
    _, stderr = command.communicate(timeout=120)
    assert command.returncode == 0, stderr[-3000:]
    seen = wait_for_json(tmp_path / "probe.json")
    assert (seen["pid"], seen["env"]) == (command.pid, "direct")  # exec'd in place: the same process
    assert flow_run_state(run_id).is_completed()


def test_a_run_that_cannot_start_fails_alone_and_the_server_keeps_serving(fork_server, probe_deployment, tmp_path):
    import socket

    from deployments.engine_forkserver import HEADER

    # a request as the run command sends it, for a folder that is gone by the time the fork takes it
    request = json.dumps(
        {"env": dict(os.environ), "cwd": str(tmp_path / "gone"), "path": sys.path, "argv": []}
    ).encode()
    err_read, err_write = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.connect(fork_server)
        socket.send_fds(server, [HEADER.pack(len(request))], [0, 1, err_write])
        server.sendall(request)
        os.close(err_write)
        replies = server.makefile("r").read().split("\n")
    with os.fdopen(err_read) as stderr:
        message = stderr.read()
    assert replies[0].startswith("pid ") and replies[1] == "exit 1", replies
    assert "FileNotFoundError" in message  # its reason, on the caller's stderr
    run_id = probe_deployment(tmp_path / "probe.json")
    after = start_run(fork_server, run_id, tmp_path)
    assert after.wait(timeout=120) == 0 and flow_run_state(run_id).is_completed()
    assert wait_for_json(tmp_path / "probe.json")["pid"] != after.pid  # a fork: the server still serves


def test_a_garbled_request_is_refused_with_its_reason_and_the_server_keeps_serving(fork_server, tmp_path):
    import socket

    from deployments.engine_forkserver import HEADER

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.connect(fork_server)
        socket.send_fds(server, [HEADER.pack(9)], [0, 1, 2])
        server.sendall(b"not json!")
        assert server.makefile("r").read() == ""  # closed with no pid: no child was forked for it
    command = start_run(fork_server, "not-a-uuid", tmp_path)  # the next caller is served as usual
    _, stderr = command.communicate(timeout=60)
    assert command.returncode == 1 and "Invalid flow run id" in stderr


# --------------------------------------------------------------------------- who can reach the fork server


def test_the_stacks_socket_lives_in_a_private_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINES_RUNTIME_DIR", str(tmp_path / "runtime"))
    folder = Path(local_stack.engine_socket()).parent
    assert folder == tmp_path / "runtime"
    assert (folder.stat().st_uid, folder.stat().st_mode & 0o777) == (os.getuid(), 0o700)


def test_the_server_refuses_a_folder_others_may_reach(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    server = subprocess.run(
        [sys.executable, FORKSERVER, "serve", str(loose / "engine.sock")], capture_output=True, text=True, timeout=120
    )
    assert server.returncode != 0 and "others may reach it" in server.stderr
    assert not (loose / "engine.sock").exists()


def test_run_never_hands_its_environment_to_a_socket_in_a_folder_others_may_reach(tmp_path):
    import socket as socket_module

    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    listener = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
    listener.bind(str(loose / "engine.sock"))  # someone listening first at the path
    listener.listen(1)
    listener.settimeout(0.5)
    command = subprocess.run(
        [sys.executable, FORKSERVER, "run", str(loose / "engine.sock")],
        env={**os.environ, "SECRET": "s3cr3t"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "engine fork server not used" in command.stderr and "others may reach it" in command.stderr
    with pytest.raises(TimeoutError):
        listener.accept()  # never connected: nothing handed over (the engine ran itself, and failed without a run id)
    listener.close()


def test_the_server_refuses_a_caller_of_another_uid(tmp_path):
    if os.getuid() != 0:
        pytest.skip("a caller of another uid needs root to start one")
    folder = Path("/tmp") / f"forkserver-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir(mode=0o700)
    sock = folder / "engine.sock"
    try:
        with fork_server_process(FORKSERVER, str(sock)) as server:
            # let the other user reach the socket (as a careless setup might): the peer check remains
            folder.chmod(0o711)
            sock.chmod(0o777)
            caller = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    (
                        "import os, socket, struct, sys; os.setgid(65534); os.setuid(65534)\n"
                        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
                        "r, w = os.pipe()\n"
                        "try:\n"
                        "    socket.send_fds(s, [struct.pack('!Q', 2)], [r, r, r]); s.sendall(b'{}'); "
                        "print(s.recv(100) or 'closed')\n"
                        "except (BrokenPipeError, ConnectionResetError):\n"
                        "    print('closed')"
                    ),
                    str(sock),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert caller.stdout.strip() == "closed", (
                caller.stdout + caller.stderr
            )  # closed at once: no child forked for it
    finally:
        subprocess.run(["rm", "-rf", str(folder)])
    assert "refused a caller running as uid 65534" in server.stdout.read()
