"""The Prefect budget's counting proxy (benchmarks/api_budget.py): in front of a real TLS server (uvicorn, the
stack's kind of certificate), it forwards requests and websockets unchanged and counts requests per route, log lines
per ``POST /logs/`` and events per ``/events/in`` message, each under the caller found through /proc."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from benchmarks import api_budget
from deployments import stack_tls
from deployments.dynamodb_local import free_port

ME = ("benchmark (user's polls)", "")


async def _logs(request: Request) -> JSONResponse:
    return JSONResponse({"received": len(await request.json())}, status_code=201)


async def _run(request: Request) -> JSONResponse:
    return JSONResponse({"id": request.path_params["run_id"], "big": "x" * 200_000})


async def _events_in(websocket: WebSocket) -> None:
    await websocket.accept()
    assert "sec-websocket-extensions" not in websocket.headers  # the proxy keeps the frames uncompressed
    while True:
        message = json.loads(await websocket.receive_text())
        if message.get("type") == "auth":
            await websocket.send_text(json.dumps({"type": "auth_success"}))


APP = Starlette(
    routes=[
        Route("/api/logs/", _logs, methods=["POST"]),
        Route("/api/flow_runs/{run_id}", _run),
        WebSocketRoute("/api/events/in", _events_in),
    ]
)


@pytest.fixture
def proxied(tmp_path):
    """A TLS server on a free port and the counting proxy in front of it: (proxy base URL, proxy, certificate)."""
    cert, key = stack_tls.certificate_files(tmp_path / "secrets")
    upstream = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            APP, host="127.0.0.1", port=upstream, ssl_certfile=str(cert), ssl_keyfile=str(key), log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    proxy = api_budget.BudgetProxy(0, upstream, cert, key).start()
    yield f"https://127.0.0.1:{proxy.listen_port}", proxy, cert
    proxy.stop()
    server.should_exit = True
    thread.join(10)


def test_requests_and_log_lines_are_counted_per_route_and_caller(proxied):
    base, proxy, cert = proxied
    run_id = "0b6c3f0e-3f7a-4f53-9a51-1c2d3e4f5a6b"
    with httpx.Client(verify=ssl.create_default_context(cafile=str(cert))) as client:  # one kept-alive connection
        posted = client.post(f"{base}/api/logs/", json=[{"message": f"line {i}"} for i in range(7)])
        chunked = client.post(f"{base}/api/logs/", content=iter([b'[{"m": 1},', b' {"m": 2}]']))
        run = client.get(f"{base}/api/flow_runs/{run_id}?x=1")
    assert posted.status_code == 201 and posted.json() == {"received": 7}
    assert chunked.json() == {"received": 2}
    assert run.json()["id"] == run_id and len(run.json()["big"]) == 200_000  # a large answer passes whole
    counts = proxy.counts.snapshot()
    assert counts["requests"] == {(ME, "POST /api/logs/"): 2, (ME, "GET /api/flow_runs/{id}"): 1}
    assert counts["logs"] == {ME: 9}


def test_events_over_the_websocket_are_counted_without_the_auth_message(proxied):
    import websockets

    base, proxy, cert = proxied

    async def send() -> None:
        url = base.replace("https", "wss") + "/api/events/in"
        context = ssl.create_default_context(cafile=str(cert))
        async with websockets.connect(url, ssl=context) as socket:  # offers permessage-deflate: refused
            await socket.send(json.dumps({"type": "auth", "token": None}))
            assert json.loads(await socket.recv()) == {"type": "auth_success"}
            for i in range(5):
                await socket.send(json.dumps({"event": "x", "payload": "y" * (100 if i else 70_000)}))
            await socket.ping()

    asyncio.run(send())
    deadline = time.monotonic() + 5
    while proxy.counts.snapshot()["events"].get(ME, 0) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    counts = proxy.counts.snapshot()
    assert counts["events"] == {ME: 5}
    assert counts["requests"] == {(ME, "GET /api/events/in"): 1}


def test_the_report_splits_by_pipeline_and_names_the_plan():
    feed = {
        "requests": {
            (("flow run", "a"), "POST /api/task_runs/"): 300,
            (("flow run", "b"), "POST /api/logs/"): 60,
            (("worker", ""), "POST /api/work_pools/local/get_scheduled_flow_runs"): 120,
        },
        "logs": {("flow run", "a"): 600},
        "events": {("flow run", "b"): 900},
    }
    names = {"a": "ndjson-merge", "b": "video-listen"}
    text = api_budget.report(feed, 2.0, {"etl": 300, "video": 2}, names, None, 0)
    assert "flow run ndjson-merge" in text and "listener video-listen" in text
    etl_row = next(line for line in text.splitlines() if line.strip().startswith("etl "))
    assert etl_row.split()[2:] == ["150.0", "300.0", "1.00", "2.00"]  # req/min, l+e/min, per file
    all_row = next(line for line in text.splitlines() if line.strip().startswith("all "))
    assert "fits: Hobby (within the goal, half Hobby)" in all_row  # 240 req/min, 750 logs+events/min
    assert api_budget.fits(700, 100) == "Starter" and api_budget.fits(6000, 100) == "over Pro"
