"""A stand-in Docker Engine API on loopback for `prefect deploy --name ecs`: no Docker daemon runs here (and no
base image could be pulled), so prefect-docker's build and push steps talk to this one through DOCKER_HOST.

It answers the calls docker-py makes for them (version, build, image inspect, tag, push) and keeps what it was
sent: each build's query (Dockerfile, tag, platform) and the names in its context tar, which docker-py packs
from the working directory minus .dockerignore, as for a real daemon; each push's repository and tag.

Its registry checks credentials as ECR does: a push carries the login of the Docker client that makes it (docker-py's
``X-Registry-Auth`` header, filled from ``client.login`` in that process or the Docker config file), and the
registry refuses one without user ``AWS`` and the password ``ecr get-authorization-token`` gave ("no basic auth
credentials", in the push's stream, as the daemon reports it); a ``docker login`` (``/auth``) with others is refused.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

REPO_ROOT = Path(__file__).resolve().parents[2]

API_VERSION = "1.45"


@dataclass
class DockerStandin:
    """What the stand-in daemon was asked to do."""

    host: str = ""
    builds: list[dict] = field(default_factory=list)
    tags: list[tuple[str, str]] = field(default_factory=list)
    pushes: list[tuple[str, str]] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # the pushes the registry refused, with why


@contextlib.contextmanager
def docker_standin(
    on_push: Callable[[str, str], None] | None = None, registry_password: Callable[[], str] | None = None
) -> Iterator[DockerStandin]:
    """Serve the stand-in on a free loopback port; yields it (``host`` is the DOCKER_HOST value). ``on_push``
    (repository, tag) is told each push, e.g. to put the image in an emulated registry. ``registry_password``
    gives the password ECR accepts now (its authorization token's); without it any non-empty one is taken."""
    record = DockerStandin()

    def accepted(credentials: dict) -> bool:
        """Whether the registry takes these credentials: ECR's user ``AWS`` and its current token."""
        password = credentials.get("password") or ""
        wanted = registry_password() if registry_password else password
        return credentials.get("username") == "AWS" and bool(password) and password == wanted

    def pushed_with(header: str | None) -> dict:
        """The credentials an ``X-Registry-Auth`` header carries (base64url JSON), or none."""
        if not header:
            return {}
        try:
            return json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))
        except ValueError:
            return {}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, payload: object | list, stream: bool = False) -> None:
            """A JSON answer; a stream (build, push) as one chunk per message, as the daemon sends it."""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            if not stream:
                body = json.dumps(payload).encode()
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for message in payload:
                chunk = json.dumps(message).encode() + b"\r\n"
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")

        def _path(self) -> tuple[str, dict[str, str]]:
            parsed = urlparse(self.path)
            path = parsed.path.split("/", 2)[2] if parsed.path.startswith("/v1.") else parsed.path.lstrip("/")
            return path, {k: v[-1] for k, v in parse_qs(parsed.query).items()}

        def do_GET(self):
            path, _ = self._path()
            if path == "version":
                self._send(200, {"ApiVersion": API_VERSION, "Version": "standin", "MinAPIVersion": "1.24"})
            elif path.startswith("images/") and path.endswith("/json"):
                self._send(200, {"Id": path[len("images/") : -len("/json")], "RepoTags": []})
            else:
                self._send(404, {"message": f"the stand-in does not serve GET /{path}"})

        def do_POST(self):
            path, query = self._path()
            body = (
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Length")
                else b""
            )
            if not body and self.headers.get("Transfer-Encoding") == "chunked":
                body = self._chunked()
            if path == "build":
                with tarfile.open(fileobj=io.BytesIO(body)) as context:
                    names = sorted(m.name for m in context.getmembers() if m.isfile())
                image_id = "sha256:" + hashlib.sha256(body).hexdigest()
                record.builds.append({"query": query, "files": names, "image_id": image_id})
                self._send(200, [{"stream": f"built {len(names)} files\n"}, {"aux": {"ID": image_id}}], stream=True)
            elif path.startswith("images/") and path.endswith("/tag"):
                record.tags.append((query["repo"], query["tag"]))
                self._send(201, {})
            elif path == "auth":  # docker login: the registry checks the credentials
                credentials = json.loads(body or b"{}")
                if not accepted(credentials):
                    self._send(401, {"message": "login attempt failed with status: 401 Unauthorized"})
                    return
                record.logins.append(credentials.get("serveraddress", ""))
                self._send(200, {"Status": "Login Succeeded"})
            elif path.startswith("images/") and path.endswith("/push"):
                repository = path[len("images/") : -len("/push")]
                if not accepted(pushed_with(self.headers.get("X-Registry-Auth"))):
                    record.refused.append(f"{repository}:{query.get('tag', '')}: no basic auth credentials")
                    error = {
                        "errorDetail": {"message": "no basic auth credentials"},
                        "error": "no basic auth credentials",
                    }
                    self._send(200, [{"status": "The push refers to repository"}, error], stream=True)
                    return
                record.pushes.append((repository, query.get("tag", "")))
                if on_push is not None:
                    on_push(*record.pushes[-1])
                self._send(
                    200,
                    [{"status": "Pushed"}, {"aux": {"Tag": query.get("tag", ""), "Digest": "sha256:0"}}],
                    stream=True,
                )
            else:
                self._send(404, {"message": f"the stand-in does not serve POST /{path}"})

        def _chunked(self) -> bytes:
            chunks = []
            while (size := int(self.rfile.readline().strip() or b"0", 16)) > 0:
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
            return b"".join(chunks)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    record.host = f"tcp://127.0.0.1:{server.server_address[1]}"
    try:
        yield record
    finally:
        server.shutdown()
        server.server_close()


# the image the ecs deployments build and push (prefect.yaml's variables), in the tests that deploy them
ECS_IMAGE = {
    "PIPELINES_IMAGE_REPOSITORY": "123456789012.dkr.ecr.us-east-1.amazonaws.com/pipelines",
    "PIPELINES_IMAGE_TAG": "test-1",
    "ECS_EXECUTION_ROLE_ARN": "arn:aws:iam::123456789012:role/execution",
}


def prefect_deploy(pattern: str, extra_env: dict[str, str] | None = None) -> None:
    """`prefect deploy --name PATTERN` from the repository, on the test's server, as a user runs it."""
    from prefect.settings import PREFECT_API_URL

    env = {
        **os.environ,
        "PREFECT_API_URL": PREFECT_API_URL.value(),
        "PIPELINES_ROOT": str(REPO_ROOT),
        **(extra_env or {}),
    }
    result = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--name", pattern],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
