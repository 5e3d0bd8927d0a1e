"""A local stand-in for a SageMaker asynchronous inference endpoint, reached through the real boto3 client.

It answers ``InvokeEndpointAsync`` (POST /endpoints/{name}/async-invocations) like SageMaker: 202, an
InferenceId, and the OutputLocation / FailureLocation headers; then, in the background, it reads the object at
the InputLocation header (file:// or s3://), runs the text-redact backend on it (the ``mode=`` custom attribute
picks the mode) and writes the result to the output location, or the error's text to the failure location.
"""

from __future__ import annotations

import json
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tasks.core.object_store import open_url
from tasks.video import inference as video_inference


class AsyncEndpoint:
    """Endpoints named ``endpoints`` on loopback; outputs and failures go under ``output_url`` (file:// or s3://)."""

    def __init__(self, output_url: str, endpoints: tuple[str, ...] = ("text-redact",)):
        self.output_url, self.endpoints = output_url.rstrip("/"), endpoints
        self.fail_with: str | None = None  # set: every invocation fails with this text in its failure location
        self.silent = False  # set: accept invocations and never answer (the caller's wait times out)
        self.invocations: list[dict[str, str]] = []
        self.workers: list[threading.Thread] = []
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                parts = self.path.strip("/").split("/")
                if len(parts) != 3 or parts[0] != "endpoints" or parts[2] != "async-invocations":
                    return self._answer(404, {"message": f"no route {self.path}"})
                if parts[1] not in standin.endpoints:
                    return self._answer(
                        400,
                        {"message": f"Endpoint {parts[1]} of account 000000000000 not found."},
                        {"x-amzn-ErrorType": "ValidationError"},
                    )
                inference_id = self.headers.get("X-Amzn-SageMaker-Inference-Id") or str(uuid.uuid4())
                output = f"{standin.output_url}/output/{inference_id}.out"
                failure = f"{standin.output_url}/failure/{inference_id}-error.out"
                call = {
                    "endpoint": parts[1],
                    "input": self.headers["X-Amzn-SageMaker-InputLocation"],
                    "attributes": self.headers.get("X-Amzn-SageMaker-Custom-Attributes", ""),
                    "output": output,
                }
                standin.invocations.append(call)
                if not standin.silent:
                    worker = threading.Thread(target=standin.run, args=(call, failure), daemon=True)
                    standin.workers.append(worker)
                    worker.start()
                self._answer(
                    202,
                    {"InferenceId": inference_id},
                    {"X-Amzn-SageMaker-OutputLocation": output, "X-Amzn-SageMaker-FailureLocation": failure},
                )

            def _answer(self, status: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def run(self, call: dict[str, str], failure: str) -> None:
        """The model container's work: input object -> text-redact backend -> output object (or failure object)."""
        attributes = dict(part.split("=", 1) for part in call["attributes"].split(";") if "=" in part)
        with tempfile.TemporaryDirectory() as tmp:
            source, target = Path(tmp) / "input.mp4", Path(tmp) / "output.mp4"
            try:
                if self.fail_with:
                    raise RuntimeError(self.fail_with)
                store, key = open_url(call["input"])
                store.download(key, source)
                video_inference.infer("text-redact", source, target, attributes.get("mode", "identity"))
                store, key = open_url(call["output"])
                store.put_file(key, target)
            except Exception as error:  # noqa: BLE001 - SageMaker writes the model container's error to the failure location
                store, key = open_url(failure)
                store.put_bytes(key, f"{type(error).__name__}: {error}".encode())

    def close(self) -> None:
        """Stop serving and wait for the invocations still running."""
        self.server.shutdown()
        self.server.server_close()
        for worker in self.workers:
            worker.join(timeout=60)
