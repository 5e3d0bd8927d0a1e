"""A container definition of the template run as ECS runs it, without Docker: its command and environment, as its
user, with every mount of the root file system read-only and each bind mount a fresh folder, in a mount namespace
of its own (`unshare -m`), until its health check command passes.

ECS's rule for a bind mount (ECS developer guide, "Bind mounts"; containers-roadmap #938): the folder starts empty,
owned by root with mode 0755, unless the image declares the container path with VOLUME; then the image's content
and ownership at that path are copied in. The image's ownership is what the Dockerfile's runtime stage gives the
path with `install -d -o UID -g GID -m MODE PATH` (any other path: root's, 0755, as `mkdir` makes it).

The project's venv stands in for the image's /opt/venv and the checkout (PYTHONPATH) for the installed package; the
venv's python sits under root's 0700 home here, so the container's user may read and search any folder
(CAP_DAC_READ_SEARCH), which grants no write: what it may write is exactly what the image and ECS let it.

    python -m tests.helpers.aws_container SPEC.json   # as root, inside `unshare -m`
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dockerfile_parse import DockerfileParser

REPO_ROOT = Path(__file__).resolve().parents[2]
KERNEL_MOUNTS = ("/proc", "/sys", "/dev")  # not the image's: ECS gives a read-only-root container these as usual


def runtime_stage(dockerfile: Path) -> list[dict[str, Any]]:
    """The instructions of the Dockerfile's last stage, from its FROM."""
    instructions = DockerfileParser(str(dockerfile)).structure
    start = max(i for i, instruction in enumerate(instructions) if instruction["instruction"] == "FROM")
    return instructions[start:]


def image_user(stage: list[dict[str, Any]]) -> tuple[int, int]:
    """(uid, gid) of the stage's last USER (numeric, as the project's Dockerfile gives it)."""
    user = [i["value"] for i in stage if i["instruction"] == "USER"][-1]
    uid, _, gid = user.partition(":")
    return int(uid), int(gid or uid)


def image_volumes(stage: list[dict[str, Any]]) -> set[str]:
    """The paths the stage declares with VOLUME (JSON array or words)."""
    paths: set[str] = set()
    for instruction in (i for i in stage if i["instruction"] == "VOLUME"):
        value = instruction["value"].strip()
        paths |= set(json.loads(value) if value.startswith("[") else value.split())
    return paths


def image_ownership(stage: list[dict[str, Any]], path: str) -> tuple[int, int, int]:
    """(uid, gid, mode) the image gives ``path``: its `install -d -o -g -m` in a RUN, else root's 0755."""
    found = (0, 0, 0o755)
    for instruction in (i for i in stage if i["instruction"] == "RUN"):
        for command in (shlex.split(part) for part in re.split(r"&&|;", instruction["value"])):
            if command[:2] == ["install", "-d"] and command[-1].rstrip("/") == path.rstrip("/"):
                options = dict(zip(command[2:-1:2], command[3:-1:2]))
                found = (int(options.get("-o", 0)), int(options.get("-g", 0)), int(options.get("-m", "0755"), 8))
    return found


def fresh_bind_mount(stage: list[dict[str, Any]], container_path: str, folder: Path) -> Path:
    """The folder ECS mounts at ``container_path``: empty, root's 0755, or the image's ownership for a VOLUME."""
    folder.mkdir(parents=True)
    uid, gid, mode = image_ownership(stage, container_path) if container_path in image_volumes(stage) else (0, 0, 0o755)
    os.chown(folder, uid, gid)
    folder.chmod(mode)
    return folder


def resolve(value: Any, parameters: dict[str, str]) -> Any:
    """A template value with its intrinsics filled in: Ref and ${…} from ``parameters`` (a resource: a stand-in
    name), GetAtt as a stand-in, Fn::If by its condition's parameter being non-empty."""
    if isinstance(value, list):
        return [resolve(v, parameters) for v in value]
    if not isinstance(value, dict):
        return value
    if "Ref" in value:
        return parameters.get(value["Ref"], f"stand-in-{value['Ref']}")
    if "Fn::Sub" in value:
        return re.sub(
            r"\$\{([^}]+)\}", lambda m: parameters.get(m.group(1), f"stand-in-{m.group(1)}"), value["Fn::Sub"]
        )
    if "Fn::GetAtt" in value:
        return "stand-in-" + "-".join(value["Fn::GetAtt"])
    return {k: resolve(v, parameters) for k, v in value.items()}


def container_spec(
    container: dict[str, Any], parameters: dict[str, str], stage: list[dict[str, Any]], scratch: Path, **extra: Any
) -> dict[str, Any]:
    """What the driver needs to run ``container`` (a ContainerDefinition, intrinsics resolved): its command,
    environment, user, health check and bind mounts (container path -> the fresh folder)."""
    volumes = {}
    for mount in container.get("MountPoints", []):
        folder = scratch / f"{container['Name']}-{mount['SourceVolume']}"
        volumes[mount["ContainerPath"]] = str(fresh_bind_mount(stage, mount["ContainerPath"], folder))
    environment = {item["Name"]: item["Value"] for item in resolve(container.get("Environment", []), parameters)}
    venv_bin = Path(sys.executable).parent
    return {
        "command": container["Command"],
        "environment": {"PATH": f"{venv_bin}:/usr/bin:/bin", "PYTHONPATH": str(REPO_ROOT), **environment},
        "user": image_user(stage),
        "health_check": container["HealthCheck"]["Command"][1:],  # CMD form
        "read_only": container.get("ReadonlyRootFilesystem", False),
        "volumes": volumes,
        "working_directory": str(REPO_ROOT),  # stands in for the image's WORKDIR (the package's folder)
        **extra,
    }


def mount_points() -> list[str]:
    """Every mount point of this namespace, parents first."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        points.append(line.split()[4].encode().decode("unicode_escape"))
    return points


def make_read_only(keep: set[str]) -> None:
    """Every mount read-only but the kernel's and ``keep`` (the bind mounts): ECS's ReadonlyRootFilesystem."""
    for point in mount_points():
        if point in keep or any(point == k or point.startswith(k + "/") for k in KERNEL_MOUNTS):
            continue
        subprocess.run(["mount", "-o", "remount,bind,ro", point], capture_output=True)


def as_user(spec: dict[str, Any], command: list[str]) -> list[str]:
    """``command`` run as the container's user, no supplementary groups, reading and searching as the image lets."""
    uid, gid = spec["user"]
    caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", *caps, "--", *command]


def drive(spec: dict[str, Any]) -> int:
    """In this (private) mount namespace: the bind mounts, the read-only root, the command started; its health
    check tried every second until it passes (0) or ``timeout_s`` passes (1), each failure's output printed."""
    logs = open(spec["log"], "w")  # opened first: the bind mounts may cover the folder it is in
    sources = {path: os.open(folder, os.O_RDONLY | os.O_DIRECTORY) for path, folder in spec["volumes"].items()}
    image = os.open(spec["working_directory"], os.O_RDONLY | os.O_DIRECTORY)  # the image's files, by descriptor
    for path, source in sources.items():  # by descriptor: one mount may cover another's source folder
        subprocess.run(["mount", "--bind", f"/proc/self/fd/{source}", path], check=True, pass_fds=(source,))
    cwd = spec["working_directory"]
    if any(cwd == path or cwd.startswith(path.rstrip("/") + "/") for path in sources):
        # a checkout under a bind mount's path (a clone in /tmp) stands in for the image's own folder, which no
        # volume covers: put it back at its path (a root-owned folder in the fresh mount; the mount point's own
        # owner and mode, what the test is about, stay as ECS makes them)
        os.makedirs(cwd, exist_ok=True)
        subprocess.run(["mount", "--bind", f"/proc/self/fd/{image}", cwd], check=True, pass_fds=(image,))
    if spec["read_only"]:
        make_read_only(set(spec["volumes"]))
    env = spec["environment"]
    with logs:
        process = subprocess.Popen(as_user(spec, spec["command"]), env=env, cwd=cwd, stdout=logs, stderr=logs)
    deadline, last = time.monotonic() + spec["timeout_s"], None
    try:
        while time.monotonic() < deadline:
            check = subprocess.run(as_user(spec, spec["health_check"]), env=env, cwd=cwd, capture_output=True)
            if check.returncode == 0:
                print(json.dumps({"healthy": True}))
                return 0
            last = (check.stdout + check.stderr).decode()[-2000:]
            if process.poll() is not None:
                break
            time.sleep(1)
        print(json.dumps({"healthy": False, "exit": process.poll(), "last_check": last}))
        return 1
    finally:
        process.kill()
        process.wait()


if __name__ == "__main__":
    raise SystemExit(drive(json.loads(Path(sys.argv[1]).read_text())))
