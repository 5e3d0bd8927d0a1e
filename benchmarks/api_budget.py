"""The Prefect budget: a counting reverse proxy in front of a local stack's Prefect server.

Prefect Cloud counts, per account and minute, every API request in one bucket and every log line and event in
another (``PLANS``), and answers 429 past them. This proxy stands between every client of a stack and its server: it
terminates TLS with the stack's own certificate and key (``deployments/stack_tls.py``), forwards each request to the
real server (HTTP/1.1 and websockets alike) and counts, per caller and route:
- requests: every HTTP request (a websocket's upgrade counts one);
- logs: the lines inside each ``POST /logs/`` body;
- events: the messages sent over the ``/events/in`` websocket (its auth message aside).
A caller is found from the connection's peer port through /proc (a benchmark's shortcut, never a trust decision):
port -> socket inode -> pid -> its command line, or the flow run it serves (``PREFECT__FLOW_RUN_ID`` in its
environment, or in that of the process whose standard output it shares: the engine fork server's children).

``benchmarks/soak.py --api-budget`` runs it (the stack's clients get the proxy's port through
``PIPELINES_API_CLIENT_PORT``) and prints ``report``. Alone, in front of a running stack's server:

    PIPELINES_DATA_DIR=... .venv/bin/python benchmarks/api_budget.py --listen PORT --upstream SERVER_PORT --minutes 5
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import ssl
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HOST = "127.0.0.1"
PLANS = (  # Prefect Cloud: (plan, API requests a minute, logs + events a minute)
    ("Hobby", 625, 2_000),
    ("Starter", 1_250, 2_800),
    ("Team", 2_500, 8_000),
    ("Pro", 5_000, 40_000),
)
GOAL = ("half Hobby", 312, 1_000)
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PIPELINE_PREFIXES = {"ndjson": "etl", "video": "video", "records": "records", "phspectra": "phspectra", "gpu": "gpu"}


def route(method: str, target: str) -> str:
    """``METHOD /path`` with ids as ``{id}`` and the query left off: one row per kind of call."""
    return f"{method} {UUID.sub('{id}', target.split('?', 1)[0])}"


class Counts:
    """What the proxy counted: (caller, route) -> requests; caller -> log lines; caller -> events."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: collections.Counter = collections.Counter()
        self.logs: collections.Counter = collections.Counter()
        self.events: collections.Counter = collections.Counter()

    def add(self, bucket: str, key, n: int = 1) -> None:
        with self.lock:
            getattr(self, bucket)[key] += n

    def snapshot(self) -> dict[str, collections.Counter]:
        with self.lock:
            return {b: collections.Counter(getattr(self, b)) for b in ("requests", "logs", "events")}


def between(before: dict, after: dict) -> dict[str, collections.Counter]:
    """The counts from snapshot ``before`` to snapshot ``after``."""
    return {b: after[b] - before[b] for b in after}


# --------------------------------------------------------------------------- callers (/proc)


class Callers:
    """A connection's caller from its peer port: ``('flow run', run id)`` or ``(kind, '')``."""

    def __init__(self, listen_port: int) -> None:
        self.listen_port, self.own_pid = listen_port, os.getpid()
        self.run_of_stdout: dict[str, str] = {}  # a flow run process's stdout link -> its run id

    def caller(self, peer_port: int) -> tuple[str, str]:
        pid = self._pid(self._inode(peer_port))
        if pid is None:
            return ("unknown", "")
        if pid == self.own_pid:
            return ("benchmark (user's polls)", "")
        run_id = self._environ(pid).get("PREFECT__FLOW_RUN_ID")
        if run_id:
            return ("flow run", run_id)
        kind = _kind(_cmdline(pid))
        if kind == "engine fork server":  # its children are the runs: each relays to its caller's stdout pipe
            pipes = {link for link in _fd_links(pid) if link.startswith("pipe:")}
            if not pipes & self.run_of_stdout.keys():
                self._refresh_runs()
            run_id = next((self.run_of_stdout[p] for p in pipes if p in self.run_of_stdout), None)
        return ("flow run", run_id) if run_id else (kind, "")

    def _inode(self, peer_port: int) -> str | None:
        local, remote = f"0100007F:{peer_port:04X}", f"0100007F:{self.listen_port:04X}"
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError), open(table) as rows:
                for row in rows:
                    fields = row.split()
                    if len(fields) > 9 and fields[1].endswith(local) and fields[2].endswith(remote):
                        return fields[9]
        return None

    def _pid(self, inode: str | None) -> int | None:
        if not inode:
            return None
        target = f"socket:[{inode}]"
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                for fd in os.scandir(f"/proc/{entry.name}/fd"):
                    if _readlink(fd.path) == target:
                        return int(entry.name)
        return None

    def _environ(self, pid: int) -> dict[str, str]:
        try:
            raw = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            return {}
        pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
        return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}

    def _refresh_runs(self) -> None:
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                run_id = self._environ(int(entry.name)).get("PREFECT__FLOW_RUN_ID")
                stdout = _readlink(f"/proc/{entry.name}/fd/1") if run_id else None
                if stdout and stdout.startswith("pipe:"):
                    self.run_of_stdout[stdout] = run_id


def _readlink(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _fd_links(pid: int) -> list[str]:
    try:
        return [link for fd in os.scandir(f"/proc/{pid}/fd") if (link := _readlink(fd.path))]
    except OSError:
        return []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _kind(cmdline: str) -> str:
    for needle, kind in (
        ("prefect worker start", "worker"),
        ("engine_forkserver", "engine fork server"),
        ("keep-listeners", "listeners' keeper"),
        ("serve-server", "server's own services"),
        ("held_port", "server's own services"),
        ("local_stack", "local_stack command"),
    ):
        if needle in cmdline:
            return kind
    return f"other: {Path(cmdline.split(' ', 1)[0]).name or '?'}"


# --------------------------------------------------------------------------- the proxy


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        return None


def _headers(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    pairs = [tuple(part.strip() for part in line.split(":", 1)) for line in lines[1:] if ":" in line]
    return lines[0], pairs


def _header(pairs, name: str) -> str:
    return next((v for k, v in pairs if k.lower() == name), "")


async def _read_body(reader: asyncio.StreamReader, pairs, until_eof: bool = False) -> tuple[bytes, bytes]:
    """The message body as sent (raw) and decoded (chunks joined)."""
    if "chunked" in _header(pairs, "transfer-encoding").lower():
        raw, data = bytearray(), bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            raw += size_line
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                    raw += trailer
                raw += b"\r\n"
                return bytes(raw), bytes(data)
            chunk = await reader.readexactly(size + 2)
            raw += chunk
            data += chunk[:-2]
    length = _header(pairs, "content-length")
    if length:
        body = await reader.readexactly(int(length))
        return body, body
    if until_eof:
        body = await reader.read()
        return body, body
    return b"", b""


class WebSocketMessages:
    """Counts the complete messages in a client's websocket frames (masked, as a client sends them)."""

    def __init__(self, on_message) -> None:
        self.buffer, self.parts, self.on_message = bytearray(), bytearray(), on_message

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while (frame := self._frame()) is not None:
            fin, opcode, payload = frame
            if opcode >= 8:  # ping, pong, close
                continue
            self.parts += payload
            if fin:
                self.on_message(bytes(self.parts))
                self.parts.clear()

    def _frame(self):
        b = self.buffer
        if len(b) < 2:
            return None
        length, at = b[1] & 0x7F, 2
        if length == 126:
            if len(b) < 4:
                return None
            length, at = int.from_bytes(b[2:4], "big"), 4
        elif length == 127:
            if len(b) < 10:
                return None
            length, at = int.from_bytes(b[2:10], "big"), 10
        masked = b[1] & 0x80
        end = at + (4 if masked else 0) + length
        if len(b) < end:
            return None
        payload = bytes(b[end - length : end])
        if masked and length:
            mask = bytes(b[at : at + 4]) * (length // 4 + 1)
            payload = (int.from_bytes(payload, "big") ^ int.from_bytes(mask[:length], "big")).to_bytes(length, "big")
        fin, opcode = b[0] & 0x80, b[0] & 0x0F
        del b[:end]
        return fin, opcode, payload


class BudgetProxy:
    """The counting proxy on its own thread and event loop: ``start()``, ``counts.snapshot()``, ``stop()``."""

    def __init__(self, listen_port: int, upstream_port: int, cert: Path, key: Path) -> None:
        """``listen_port`` 0: a port of the kernel's choice (``listen_port`` once started)."""
        self.listen_port, self.upstream_port = listen_port, upstream_port
        self.counts, self.callers = Counts(), Callers(listen_port)
        self.serve_ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.serve_ssl.load_cert_chain(str(cert), str(key))
        self.upstream_ssl = ssl.create_default_context(cafile=str(cert))
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.run_ids: set[str] = set()
        self.connections: set[asyncio.Task] = set()

    def start(self) -> BudgetProxy:
        threading.Thread(target=self._run, daemon=True, name="api-budget-proxy").start()
        if not self.ready.wait(30):
            raise RuntimeError("the counting proxy did not start")
        return self

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        # listening the moment it is bound (port 0: the kernel's choice), never a port freed and taken again
        server = self.loop.run_until_complete(
            asyncio.start_server(self._connection, HOST, self.listen_port, ssl=self.serve_ssl, limit=1 << 24)
        )
        self.listen_port = server.sockets[0].getsockname()[1]
        self.callers.listen_port = self.listen_port
        self.ready.set()
        with contextlib.suppress(RuntimeError):
            self.loop.run_forever()
        server.close()
        pending = asyncio.all_tasks(self.loop)
        for connection in pending:
            connection.cancel()
        self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections.add(asyncio.current_task())  # held: a task only the loop knows may be collected mid-way
        # the caller is looked up (/proc) while the first request is forwarded: it costs the client no wait
        caller = asyncio.ensure_future(asyncio.to_thread(self.callers.caller, client_w.get_extra_info("peername")[1]))
        try:
            up_r, up_w = await asyncio.open_connection(
                HOST, self.upstream_port, ssl=self.upstream_ssl, server_hostname=HOST, limit=1 << 24
            )
        except OSError:
            self.connections.discard(asyncio.current_task())
            client_w.close()
            return
        try:
            await self._exchange(caller, client_r, client_w, up_r, up_w)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ssl.SSLError, ValueError):
            pass
        finally:
            self.connections.discard(asyncio.current_task())
            for writer in (client_w, up_w):
                with contextlib.suppress(Exception):
                    writer.close()

    async def _exchange(self, caller, client_r, client_w, up_r, up_w) -> None:
        """Requests and responses on one kept-alive connection, in turn; a websocket upgrade hands over to ``_pipe``."""
        while (head := await _read_head(client_r)) is not None:
            request_line, pairs = _headers(head)
            method, target = request_line.split(" ", 2)[:2]
            raw, body = await _read_body(client_r, pairs)
            upgrade = _header(pairs, "upgrade").lower() == "websocket"
            if upgrade:  # no permessage-deflate: the frames stay readable for the count
                head = (
                    b"".join(
                        line + b"\r\n"
                        for line in head[:-4].split(b"\r\n")
                        if not line.lower().startswith(b"sec-websocket-extensions")
                    )
                    + b"\r\n"
                )
            up_w.write(head + raw)
            await up_w.drain()
            kind = route(method, target)
            if isinstance(caller, asyncio.Future):
                caller = await caller
                if caller[0] == "flow run":
                    self.run_ids.add(caller[1])
            self.counts.add("requests", (caller, kind))
            if method == "POST" and kind.endswith("/logs/"):
                with contextlib.suppress(ValueError):
                    self.counts.add("logs", caller, len(json.loads(body)))
            response = await _read_head(up_r)
            if response is None:
                return
            status_line, response_pairs = _headers(response)
            status = int(status_line.split(" ", 2)[1])
            if status == 101:
                client_w.write(response)
                await client_w.drain()
                await self._pipe(caller, kind, client_r, client_w, up_r, up_w)
                return
            closing = _header(response_pairs, "connection").lower() == "close"
            raw_response = b""
            if method != "HEAD" and status not in (204, 304) and status >= 200:
                raw_response, _ = await _read_body(up_r, response_pairs, until_eof=closing)
            client_w.write(response + raw_response)
            await client_w.drain()
            if closing or _header(pairs, "connection").lower() == "close":
                return

    async def _pipe(self, caller, kind, client_r, client_w, up_r, up_w) -> None:
        counting = kind.endswith("/events/in")

        def message(payload: bytes) -> None:
            if counting and not payload.replace(b" ", b"").startswith(b'{"type":"auth"'):
                self.counts.add("events", caller)

        frames = WebSocketMessages(message)

        async def copy(reader, writer, parse) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await reader.read(1 << 16):
                    if parse:
                        frames.feed(data)
                    writer.write(data)
                    await writer.drain()
            with contextlib.suppress(Exception):
                writer.close()

        await asyncio.gather(copy(client_r, up_w, True), copy(up_r, client_w, False))


# --------------------------------------------------------------------------- the report


def run_names(run_ids, upstream_url: str) -> dict[str, str]:
    """Flow run id -> its flow's name, read from the server itself (not through the proxy: not counted)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterId, FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    ids, names = sorted(run_ids), {}
    with temporary_settings(updates={PREFECT_API_URL: upstream_url}), get_client(sync_client=True) as client:
        for start in range(0, len(ids), 200):
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids[start : start + 200])), limit=200
            )
            flow_ids = FlowFilter(id=FlowFilterId(any_=list({r.flow_id for r in runs})))
            flows = {f.id: f.name for f in client.read_flows(flow_filter=flow_ids)}
            names.update({str(r.id): flows.get(r.flow_id, "?") for r in runs})
    return names


def caller_label(caller: tuple[str, str], names: dict[str, str]) -> str:
    kind, run_id = caller
    if kind != "flow run":
        return kind
    flow = names.get(run_id, "?")
    return f"listener {flow}" if flow.endswith("-listen") else f"flow run {flow}"


def pipeline_of(label: str) -> str:
    """The pipeline a caller works for (by its flow's name), else 'background'."""
    if label.startswith(("flow run ", "listener ")):
        flow = label.split(" ", 2)[-1]
        for prefix, pipeline in PIPELINE_PREFIXES.items():
            if flow.startswith(prefix) and not flow.endswith(("-sweep", "-sweep-stuck", "-reconcile")):
                return pipeline
    return "background"


def fits(requests_per_min: float, logs_events_per_min: float) -> str:
    goal = " (within the goal, half Hobby)" if requests_per_min <= GOAL[1] and logs_events_per_min <= GOAL[2] else ""
    for plan, requests, logs_events in PLANS:
        if requests_per_min <= requests and logs_events_per_min <= logs_events:
            return plan + goal
    return "over Pro"


def _by(counts: dict, names: dict, key) -> dict[str, list[float]]:
    """label -> [requests, logs, events], labels from ``key(caller label)``."""
    rows: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0, 0])
    for (caller, _), n in counts["requests"].items():
        rows[key(caller_label(caller, names))][0] += n
    for i, bucket in ((1, "logs"), (2, "events")):
        for caller, n in counts[bucket].items():
            rows[key(caller_label(caller, names))][i] += n
    return rows


def report(feed: dict, minutes: float, landed: dict[str, int], names: dict, idle: dict | None, idle_min: float) -> str:
    """The feed window's counts: per caller, per pipeline (per landed file), background, per minute, the plan each
    fits; the idle window's per minute; the costliest routes."""
    out = [f"\nThe Prefect budget over the feed ({minutes:.1f} min, {sum(landed.values())} landed)"]
    out.append(f"  {'caller':44} {'requests':>9} {'logs':>7} {'events':>7} {'req/min':>8} {'l+e/min':>8}")
    for label, (r, lg, ev) in sorted(_by(feed, names, lambda x: x).items(), key=lambda kv: -kv[1][0]):
        out.append(f"  {label[:44]:44} {r:9.0f} {lg:7.0f} {ev:7.0f} {r / minutes:8.1f} {(lg + ev) / minutes:8.1f}")
    out.append(f"\n  {'pipeline':12} {'landed':>7} {'req/min':>8} {'l+e/min':>8} {'req/file':>9} {'l+e/file':>9}")
    total = [0.0, 0.0]
    for name, (r, lg, ev) in sorted(_by(feed, names, pipeline_of).items()):
        n = landed.get(name, 0)
        per = f"{r / n:9.2f} {(lg + ev) / n:9.2f}" if n else f"{'-':>9} {'-':>9}"
        out.append(f"  {name:12} {n:7} {r / minutes:8.1f} {(lg + ev) / minutes:8.1f} {per}")
        total[0], total[1] = total[0] + r, total[1] + lg + ev
    files = max(sum(landed.values()), 1)
    req_min, le_min = total[0] / minutes, total[1] / minutes
    out.append(
        f"  {'all':12} {sum(landed.values()):7} {req_min:8.1f} {le_min:8.1f} {total[0] / files:9.2f} "
        f"{total[1] / files:9.2f}   fits: {fits(req_min, le_min)}"
    )
    if idle is not None and idle_min > 0:
        rows = _by(idle, names, lambda x: x)
        r = sum(v[0] for v in rows.values()) / idle_min
        le = sum(v[1] + v[2] for v in rows.values()) / idle_min
        detail = ", ".join(f"{k} {v[0] / idle_min:.1f}" for k, v in sorted(rows.items(), key=lambda kv: -kv[1][0]))
        out.append(
            f"\n  idle background ({idle_min:.1f} min, nothing landing): {r:.1f} req/min, {le:.1f} logs+events/min"
        )
        out.append(f"    requests/min by caller: {detail}")
        out += [f"    {line}" for line in caller_routes(idle, names, callers=4)]
    routes = collections.Counter()
    for (_, kind), n in feed["requests"].items():
        routes[kind] += n
    costliest = ", ".join(f"{k} {n}" for k, n in routes.most_common(12))
    out.append(f"\n  costliest routes (requests over the feed): {costliest}")
    out += [f"  {line}" for line in caller_routes(feed, names)]
    return "\n".join(out)


def caller_routes(counts: dict, names: dict, callers: int = 6, routes: int = 6) -> list[str]:
    """The costliest callers' own costliest routes: where a caller's requests go."""
    by_caller: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for (caller, kind), n in counts["requests"].items():
        by_caller[caller_label(caller, names)][kind] += n
    ranked = sorted(by_caller.items(), key=lambda kv: -sum(kv[1].values()))[:callers]
    return [f"{label}: " + ", ".join(f"{kind} {n}" for kind, n in kinds.most_common(routes)) for label, kinds in ranked]


def quick_check() -> int:
    """The proxy in front of a small TLS server of its own: each request and log line sent through it is counted once
    under its route and this caller, and every answer passes whole; 0, or 1 on a count that differs."""
    import http.server
    import tempfile

    import httpx

    from deployments import stack_tls

    class Upstream(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            self._answer(200, b'{"big": "' + b"x" * 100_000 + b'"}')

        def do_POST(self) -> None:
            lines = len(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self._answer(201, json.dumps({"received": lines}).encode())

        def log_message(self, *_args) -> None:
            pass

    with tempfile.TemporaryDirectory() as folder:
        cert, key = stack_tls.certificate_files(Path(folder))
        server = http.server.ThreadingHTTPServer((HOST, 0), Upstream)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        proxy = BudgetProxy(0, server.server_address[1], cert, key).start()
        base = f"https://{HOST}:{proxy.listen_port}/api"
        with httpx.Client(verify=ssl.create_default_context(cafile=str(cert))) as client:
            answers = [client.post(f"{base}/logs/", json=[{"message": i} for i in range(7)]) for _ in range(3)]
            answers.append(client.get(f"{base}/flow_runs/0b6c3f0e-3f7a-4f53-9a51-1c2d3e4f5a6b"))
        proxy.stop()
        server.shutdown()
    counts = proxy.counts.snapshot()
    requests = {route: n for (_, route), n in counts["requests"].items()}
    whole = [a.json() for a in answers[:3]] == [{"received": 7}] * 3 and len(answers[3].json()["big"]) == 100_000
    good = whole and requests == {"POST /api/logs/": 3, "GET /api/flow_runs/{id}": 1}
    good = good and sum(counts["logs"].values()) == 21
    print(f"quick: requests {dict(requests)}, log lines {sum(counts['logs'].values())}: {'ok' if good else 'WRONG'}")
    return 0 if good else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", type=int, default=0, help="the proxy's port (the stack's clients call it)")
    parser.add_argument("--upstream", type=int, help="the Prefect server's port")
    parser.add_argument("--minutes", type=float, default=5)
    parser.add_argument("--quick", action="store_true", help="the proxy's counts checked against a server of its own")
    args = parser.parse_args()
    if args.quick:
        return quick_check()
    if args.upstream is None:
        parser.error("--upstream is required (or --quick)")
    from deployments import local_stack, stack_tls

    cert, key = stack_tls.certificate_files(local_stack.secrets_folder())
    proxy = BudgetProxy(args.listen, args.upstream, cert, key).start()
    print(f"counting on https://{HOST}:{proxy.listen_port}/api for {args.minutes:g} min (Ctrl-C: report now)")
    before, began = proxy.counts.snapshot(), time.monotonic()
    with contextlib.suppress(KeyboardInterrupt):
        time.sleep(args.minutes * 60)
    counts, minutes = between(before, proxy.counts.snapshot()), (time.monotonic() - began) / 60
    names = run_names(proxy.run_ids, f"https://{HOST}:{args.upstream}/api")
    print(report(counts, minutes, {}, names, None, 0))
    proxy.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
