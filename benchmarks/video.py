"""Video pipeline benchmark (seed 003): the whole flow against a bare ffmpeg script, and the task bodies.

    .venv/bin/python benchmarks/video.py [--quick [--flow]] [--repeat N] [--seconds S] [--size WxH] [--no-flow]
    .venv/bin/python benchmarks/video.py --gray-only     # the whole-flow goal only: RATIO flow/bare
    .venv/bin/python benchmarks/video.py --model [--quick]  # text-redact backend frames/s against grayscale
    .venv/bin/python benchmarks/video.py --user-path [--quick]  # the user's-path goal only: RATIO user/bare

User's path: a job created with the grayscale mode and 4 s segments, its upload in place, then
what `prefect deployment run 'video-process/local' -p job_id=…` does (the same API call), on the server and process
worker that `make up` starts (here in a folder of their own, with `make up`'s settings), until final.mp4 exists;
against the same bare script, interleaved; on two clips of 60 s 1280x720 30 fps with audio in 4 s segments: the heavy
one (testsrc2 at 12 Mb/s) and a light one (testsrc at libx264's own rate: short encodes, so fixed costs show); prints
``RATIO user/bare [clip] = X`` for each (goal <= 1.15), the orchestration share and where the seconds went: the
listener's pickup, the worker's poll, the flow-run process's start, the flow body, each task's runs.

Whole flow: `video-process` on a 60 s 720p clip with the grayscale mode, through a Prefect
server, reassembly included, against a bare script doing the same ffmpeg work (segment, grayscale each part
with as many processes at once as the flow's ``max_parallel_segments``, concat), interleaved in the same run;
prints ``RATIO flow/bare = X`` (goal <= 1.3) and the orchestration share, 1 - bare/flow (goal <= 5%).

Baseline, measured in the same run on the same file: ``ffmpeg -f segment`` + concat demuxer (stream copy),
no records, no object store. The pipeline is timed twice: its task bodies called directly (DynamoDB
records, object store, probes, trigger, lock) and the `video-process` Prefect flow (adds orchestration).
Also reports the ffmpeg backend's throughput (frames/s) per mode. Goal: pipeline <= 1.3x baseline.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

from benchmarks._common import dynamodb_local


def make_source(path: Path, seconds: float, size: str, fps: int, keyframe_seconds: float) -> Path:
    """A testsrc2 clip at a realistic bitrate (12 Mb/s) with sine audio and a keyframe every ``keyframe_seconds``."""
    from tasks.video.ffmpeg import make_test_video

    return make_test_video(path, seconds, fps, size, keyframe_seconds, "testsrc2", preset="ultrafast", **{"b:v": "12M"})


# the plain script's grayscale of one part: libx264 veryfast, audio copied
GRAYSCALE = tuple(
    "-map 0 -vf format=gray,format=yuv420p -c:v libx264 -preset veryfast -crf 23 -pix_fmt yuv420p -c:a copy".split()
)


def raw_baseline(source: Path, work: Path, segment_seconds: float) -> float:
    """ffmpeg CLI segment + concat of the same file (stream copy), nothing else."""
    shutil.rmtree(work, ignore_errors=True)
    (work / "parts").mkdir(parents=True)
    start = time.perf_counter()
    _split(source, work / "parts", segment_seconds)
    listing = work / "parts.txt"
    listing.write_text("".join(f"file '{p}'\n" for p in sorted((work / "parts").glob("part-*.mp4"))))
    _concat(listing, work / "final.mp4")
    return time.perf_counter() - start


def _new_job(source: Path, segment_seconds: float) -> str:
    from tasks.core.config import object_store
    from tasks.video import jobs as v
    from tasks.video import keys

    job_id = v.create_job(f"bench-{uuid.uuid4().hex[:10]}", "identity", segment_seconds)["job_id"]
    object_store().put_file(keys.source_key(job_id), source)  # the user's upload: not timed
    return job_id


def pipeline_tasks(source: Path, segment_seconds: float, workers: int) -> tuple[float, dict]:
    """The task bodies without Prefect: chunk, identity inference over a thread pool, trigger, reassemble."""
    from tasks.video import jobs as v

    job_id = _new_job(source, segment_seconds)
    start = time.perf_counter()
    v.start_chunking(job_id)
    segment_keys = v.chunk_source(job_id, segment_seconds, "identity")
    chunked = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda key: v.infer_segment(key, backend="ffmpeg", mode="identity"), segment_keys))
    assert sum(r["triggered"] for r in results) == 1
    inferred = time.perf_counter()
    done = v.reassemble(job_id)
    end = time.perf_counter()
    assert done["status"] == "completed", done
    done["phases"] = {"chunk": chunked - start, "infer+trigger": inferred - chunked, "reassemble": end - inferred}
    return end - start, done


def pipeline_flow(source: Path, segment_seconds: float) -> tuple[float, dict]:
    """The `video-process` flow on a Prefect server (reassembly as a subflow)."""
    from flows.video import video_process

    job_id = _new_job(source, segment_seconds)
    start = time.perf_counter()
    job = video_process(job_id=job_id, segment_seconds=segment_seconds, mode="identity", backend="ffmpeg")
    elapsed = time.perf_counter() - start
    assert job["status"] == "completed", job
    return elapsed, job


def _ffmpeg(*args: str) -> None:
    """One plain ffmpeg CLI call (the bundled binary), as a user's script makes it; a failure stops the benchmark."""
    import subprocess

    from imageio_ffmpeg import get_ffmpeg_exe

    subprocess.run([get_ffmpeg_exe(), "-hide_banner", "-nostdin", "-loglevel", "error", "-y", *args], check=True)


def _split(source: Path, parts: Path, segment_seconds: float) -> None:
    """``source`` cut into ``parts``/part-NNNNN.mp4 by stream copy at keyframes near every ``segment_seconds``."""
    copy = f"-map 0 -c copy -f segment -segment_time {segment_seconds:g} -reset_timestamps 1".split()
    _ffmpeg("-i", str(source), *copy, str(parts / "part-%05d.mp4"))


def _concat(listing: Path, output: Path) -> None:
    """The parts ``listing`` names (ffmpeg's concat list) joined into ``output`` by stream copy."""
    copy = "-map 0 -c copy -movflags +faststart".split()
    _ffmpeg("-f", "concat", "-safe", "0", "-i", str(listing), *copy, str(output))


def bare_grayscale(source: Path, work: Path, segment_seconds: float, workers: int) -> float:
    """A plain script with the ffmpeg CLI, none of the project's code: segment by stream copy, grayscale each part
    with libx264 veryfast (``workers`` ffmpeg processes at once), concat by stream copy; its seconds."""
    from concurrent.futures import ThreadPoolExecutor as Pool

    shutil.rmtree(work, ignore_errors=True)
    (work / "parts").mkdir(parents=True)
    start = time.perf_counter()
    _split(source, work / "parts", segment_seconds)
    parts = sorted((work / "parts").glob("part-*.mp4"))
    outputs = [p.with_name(p.stem + "-gray.mp4") for p in parts]
    with Pool(workers) as pool:
        list(pool.map(lambda io: _ffmpeg("-i", str(io[0]), *GRAYSCALE, str(io[1])), zip(parts, outputs)))
    listing = work / "parts.txt"
    listing.write_text("".join(f"file '{o}'\n" for o in outputs))
    _concat(listing, work / "final.mp4")
    return time.perf_counter() - start


def grayscale_flow(source: Path, segment_seconds: float, workers: int) -> tuple[float, dict]:
    """The whole `video-process` flow (grayscale, reassembly included) through the Prefect server; upload not timed."""
    from flows.video import video_process
    from tasks.core.config import object_store
    from tasks.video import jobs as v
    from tasks.video import keys

    job_id = v.create_job(f"bench-gray-{uuid.uuid4().hex[:10]}", "grayscale", segment_seconds)["job_id"]
    object_store().put_file(keys.source_key(job_id), source)
    start = time.perf_counter()
    job = video_process(
        job_id=job_id,
        segment_seconds=segment_seconds,
        mode="grayscale",
        backend="ffmpeg",
        max_parallel_segments=workers,
    )
    elapsed = time.perf_counter() - start
    assert job["status"] == "completed" and job["final_frames"] == job["source_frames"], job
    return elapsed, job


def backend_throughput(
    source: Path, work: Path, segment_seconds: float, modes: list[str], workers: int, max_segments: int = 4
) -> dict:
    """frames/s of the ffmpeg backend (decode + filter + libx264 encode) over the first segments of the source."""
    from tasks.video.ffmpeg import OWN_DEMUXER, probe, segment
    from tasks.video.inference import infer

    parts = segment(source, work / "tp-parts", segment_seconds, OWN_DEMUXER)[:max_segments]
    frames = sum(probe(p).frames for p in parts)
    rates = {}
    for mode in modes:
        start = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            list(
                pool.map(
                    lambda ip, mode=mode: infer("ffmpeg", ip[1], work / f"tp-{mode}-{ip[0]}.mp4", mode),
                    enumerate(parts),
                )
            )
        rates[mode] = frames / (time.perf_counter() - start)
    return {"frames": frames, "frames_per_s": rates}


def model_vs_grayscale(source: Path, work: Path, segment_seconds: float, workers: int, batch_size: int) -> None:
    """frames/s of the text-redact backend (decode, detector, redact, libx264) against the grayscale ffmpeg backend,
    on the same segments in the same run, ``workers`` segments at once for both."""
    from tasks.video import model
    from tasks.video.ffmpeg import OWN_DEMUXER, probe, segment
    from tasks.video.inference import infer

    parts = segment(source, work / "model-parts", segment_seconds, OWN_DEMUXER)
    frames = sum(probe(p).frames for p in parts)
    model.session()  # loading the net once per process is not per-frame work
    rates = {}
    for backend, mode in (("ffmpeg", "grayscale"), ("text-redact", "grayscale")):
        start = time.perf_counter()
        with ThreadPoolExecutor(workers) as pool:
            list(
                pool.map(
                    lambda ip, backend=backend, mode=mode: infer(
                        backend, ip[1], work / f"m-{backend}-{ip[0]}.mp4", mode, batch_size=batch_size
                    ),
                    enumerate(parts),
                )
            )
        rates[backend] = frames / (time.perf_counter() - start)
        print(
            f"{backend:<12} backend, grayscale: {rates[backend]:7.1f} frames/s "
            f"({frames} frames, {workers} segments at once)"
        )
    print(
        f"text-redact on {model.provider()}, batches of {batch_size}; "
        f"RATIO model/grayscale = {rates['text-redact'] / rates['ffmpeg']:.3f} (frames/s)"
    )


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} s (range {min(values):.2f}-{max(values):.2f}, n={len(values)})"


def whole_flow_vs_bare(source: Path, work: Path, segment_seconds: float, repeat: int, workers: int) -> None:
    """`video-process` (grayscale, through a Prefect server) against the bare script, interleaved."""
    from prefect.testing.utilities import prefect_test_harness

    t0 = time.perf_counter()
    with prefect_test_harness(server_startup_timeout=180):
        print(f"(prefect server started in {time.perf_counter() - t0:.1f} s, not counted)")
        small = make_source(work / "warm-up.mp4", 2 * segment_seconds, "320x240", 30, segment_seconds / 2)
        grayscale_flow(small, segment_seconds, workers)  # warm-up (imports, first registrations) on a small clip
        bare, flows = [], []
        for _ in range(repeat):
            bare.append(bare_grayscale(source, work / "bare", segment_seconds, workers))
            flows.append(grayscale_flow(source, segment_seconds, workers)[0])
    ratio = statistics.median(flows) / statistics.median(bare)
    print(f"bare ffmpeg segment+grayscale+concat ({workers} at once): {spread(bare)}")
    print(f"video-process flow, grayscale, reassembly included:    {spread(flows)}")
    print(f"RATIO flow/bare = {ratio:.2f} (goal <= 1.3)")
    print(f"orchestration + bookkeeping share of the flow's wall time: {(1 - 1 / ratio) * 100:.1f}% (goal <= 5%)")


# --------------------------------------------------------------------------- the user's path


@contextlib.contextmanager
def local_stack_pieces(work: Path):
    """What `make up` starts for a video upload, in a folder of its own on a free port: the Prefect server, the
    work pools, the video deployments from prefect.yaml (``prefect deploy``), the engine fork server and the process
    worker with `make up`'s settings and the video listener (one run, as `make up` starts it). The benchmark's
    DynamoDB, tables and object store (this process's environment) are the worker's too."""
    from urllib.parse import urlparse

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.dynamodb_local import free_port

    saved = dict(os.environ)
    os.environ.update(
        {
            "PIPELINES_DATA_DIR": str(work / "stack"),
            "PREFECT_SERVER_PORT": str(free_port()),
            "PREFECT_POSTGRES_PORT": str(free_port()),
            "DYNAMODB_LOCAL_PORT": str(urlparse(os.environ["AWS_ENDPOINT_URL_DYNAMODB"]).port),
        }
    )
    from deployments import local_stack as stack  # reads the folder and ports above

    stopped = False
    try:
        t0 = time.perf_counter()
        # the server's database as `make up` chooses it (SQLite, with a warning, where it cannot), the server, the
        # engine fork server and the worker under the stack's supervisor (the benchmark's DynamoDB is its own)
        stack.start_postgres()
        stack.start_processes(without=("dynamodb",))
        os.environ.update(stack.local_env())
        # the stop too talks to this server (the listeners' runs): inside these settings, not the ephemeral API's
        with temporary_settings(updates={PREFECT_API_URL: os.environ["PREFECT_API_URL"]}):
            try:
                stack.ensure_work_pools()
                names = ("video-process/local", "video-reassemble/local", "video-listen/local")
                deploy = (arg for name in names for arg in ("--name", name))
                stack._prefect("--no-prompt", "deploy", *deploy, quiet=True)
                stack.ensure_listeners(worker_restarted=True)
                print(
                    f"(server, pools, deployments, worker and video listener up in {time.perf_counter() - t0:.1f} "
                    "s, not counted)"
                )
                yield stack
            finally:
                stopped = True
                stack.down()
    finally:
        if not stopped:  # a start that failed before the settings opened
            stack.down()
        os.environ.clear()
        os.environ.update(saved)


def _run_of_job(client, job_id: str):
    """The `video-process` flow run the listener started for ``job_id`` (None until it exists)."""
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    runs = client.read_flow_runs(
        flow_filter=FlowFilter(name=FlowFilterName(any_=["video-process"])),
        limit=50,
        sort=FlowRunSort.EXPECTED_START_TIME_DESC,
    )
    return next((r for r in runs if (r.parameters or {}).get("job_id") == job_id), None)


def user_path(source: Path, segment_seconds: float, timeout_s: float = 900) -> dict:
    """A user's upload: a job created with the grayscale mode (not timed), its source written to the upload target
    (renamed in whole, as an upload lands), until final.mp4 exists; with where the seconds went."""
    from datetime import datetime

    from prefect.client.orchestration import get_client

    from tasks.core.config import object_store
    from tasks.video import jobs as v
    from tasks.video import keys

    job_id = v.create_job(f"bench-user-{uuid.uuid4().hex[:10]}", "grayscale", segment_seconds)["job_id"]
    store = object_store()
    final = store.path(keys.final_key(job_id))
    start = time.perf_counter()
    store.put_file(keys.source_key(job_id), source)  # the upload lands: the user's wait starts here
    uploaded = datetime.now().astimezone()
    run, checked = None, start
    with get_client(sync_client=True) as client:
        while not final.exists():
            if time.perf_counter() - start > timeout_s:
                raise TimeoutError(f"no final.mp4 for job {job_id} after {timeout_s:g} s (run {run and run.id})")
            if time.perf_counter() - checked > 1:  # a run that ended without final.mp4 fails the benchmark at once
                checked = time.perf_counter()
                run = run or _run_of_job(client, job_id)
                state = run and client.read_flow_run(run.id).state
                if state and state.is_final() and not final.exists():
                    raise RuntimeError(
                        f"run {run.id} for job {job_id} ended {state.name} without final.mp4: {state.message}"
                    )
            time.sleep(0.02)
        elapsed = time.perf_counter() - start
        seen = datetime.now().astimezone()
        run = run or _run_of_job(client, job_id)
        while not (state := client.read_flow_run(run.id).state) or not state.is_final():
            time.sleep(0.2)
        flow_run = client.read_flow_run(run.id)
        times = {s.type.value: s.timestamp for s in client.read_flow_run_states(run.id)}
        from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])), limit=200)
    job = v.get_job(job_id)
    assert state.is_completed() and job["status"] == "completed" and job["final_frames"] == job["source_frames"], (
        state,
        job,
    )
    tasks: dict[str, list[float]] = {}
    for task_run in task_runs:  # per task name: its runs' own seconds (the task body, as Prefect timed it)
        tasks.setdefault(task_run.name.rsplit("-", 1)[0], []).append(task_run.total_run_time.total_seconds())
    return {
        "elapsed": elapsed,
        "listener": (flow_run.created - uploaded).total_seconds(),  # the listener noticing the upload, creating the run
        "poll": (times["PENDING"] - flow_run.created).total_seconds(),  # until the worker took it (its poll)
        "start": (times["RUNNING"] - times["PENDING"]).total_seconds(),  # the flow-run process starting
        "body": (seen - times["RUNNING"]).total_seconds(),  # the flow until final.mp4
        "tasks": {name: (len(values), sum(values)) for name, values in tasks.items()},
    }


def project_ffmpeg(source: Path, work: Path, segment_seconds: float, workers: int) -> float:
    """The project's own ffmpeg calls (``segment``, ``transform``, ``concat``, as the flow's tasks make them) with no
    records, object store or orchestration: what the project's ffmpeg layer costs against the plain script."""
    from tasks.video.ffmpeg import OWN_DEMUXER, concat, segment, transform

    shutil.rmtree(work, ignore_errors=True)
    start = time.perf_counter()
    parts = segment(source, work / "parts", segment_seconds, OWN_DEMUXER)  # an mp4 of make_test_video's
    outputs = [p.with_name(p.stem + "-gray.mp4") for p in parts]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda io: transform(io[0], io[1], "grayscale"), zip(parts, outputs)))
    concat(outputs, work / "final.mp4")
    return time.perf_counter() - start


def make_light_source(path: Path, seconds: float, size: str, segment_seconds: float) -> Path:
    """The light clip: testsrc (flat colours, a cheap encode) at libx264's own rate, sine audio, a keyframe every
    ``segment_seconds`` / 2; many segments whose encodes are short, so every fixed cost of the user's wait shows."""
    from tasks.video.ffmpeg import make_test_video

    return make_test_video(path, seconds, 30, size, segment_seconds / 2)


def _user_path_case(
    label: str, source: Path, work: Path, segment_seconds: float, repeat: int, workers: int
) -> tuple[list[float], list[float], list[dict]]:
    """One clip's user path against the plain script, with the project's ffmpeg calls alone, interleaved."""
    bare, ours, users = [], [], []
    for _ in range(repeat):
        bare.append(bare_grayscale(source, work / "bare", segment_seconds, workers))
        ours.append(project_ffmpeg(source, work / "ours", segment_seconds, workers))
        users.append(user_path(source, segment_seconds))
        print(f"  [{label}] script {bare[-1]:.2f} s, user path {users[-1]['elapsed']:.2f} s", flush=True)
    return bare, ours, users


def _report_user_path(label: str, bare: list[float], ours: list[float], users: list[dict], workers: int) -> None:
    median = statistics.median
    print(f"--- {label}")
    print(f"plain ffmpeg script, segment+grayscale+concat ({workers} at once): {spread(bare)}")
    print(
        f"the project's ffmpeg calls alone (segment/transform/concat):   {spread(ours)}  "
        f"ratio {median(ours) / median(bare):.2f}"
    )
    print(f"user path, upload until final.mp4:                              {spread([u['elapsed'] for u in users])}")
    print(
        "  where (median s): "
        + ", ".join(f"{part} {median(u[part] for u in users):.2f}" for part in ("listener", "poll", "start", "body"))
    )
    names = sorted({name for u in users for name in u["tasks"]})
    print(
        "  task runs in the flow (median of runs: count x, seconds summed over its runs): "
        + ", ".join(
            f"{name} {median(u['tasks'].get(name, (0, 0))[0] for u in users):g}x "
            f"{median(u['tasks'].get(name, (0, 0))[1] for u in users):.2f}"
            for name in names
        )
    )
    ratios = ", ".join(f"{u['elapsed'] / b:.2f}" for u, b in zip(users, bare))
    ratio = median(u["elapsed"] for u in users) / median(bare)
    print(
        f"RATIO user/bare [{label}] = {ratio:.2f} (medians; each run against the script beside it: {ratios}) "
        "(goal <= 1.15; bare = plain ffmpeg CLI script)"
    )
    print(
        "orchestration share of the user's wait: "
        f"{(1 - median(ours) / median(u['elapsed'] for u in users)) * 100:.1f}% "
        f"(past the project's own ffmpeg calls); ffmpeg layer share: {(1 - median(bare) / median(ours)) * 100:.1f}%"
    )


def user_path_vs_bare(sources: dict[str, Path], work: Path, segment_seconds: float, repeat: int, workers: int) -> None:
    """The user's upload → final.mp4 on the local stack's listener and worker against the plain ffmpeg script, with
    the project's ffmpeg calls alone in between, interleaved, for each clip of ``sources`` (label → clip)."""
    with local_stack_pieces(work):
        small = make_source(work / "warm-up.mp4", 2 * segment_seconds, "320x240", 30, segment_seconds / 2)
        user_path(small, segment_seconds)  # warm-up (the first flow-run process, first registrations) on a small clip
        for label, source in sources.items():  # each clip's report as it ends: a stop that fails loses none of it
            _report_user_path(label, *_user_path_case(label, source, work, segment_seconds, repeat, workers), workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="~20 s smoke run: small clip, one repeat")
    parser.add_argument("--repeat", type=int, default=None)
    parser.add_argument("--seconds", type=float, default=None, help="source length (default 60, quick 12)")
    parser.add_argument("--size", default=None, help="source size (default 1280x720, quick 320x240)")
    parser.add_argument("--segment-seconds", type=float, default=4.0)
    parser.add_argument(
        "--workers",
        type=int,
        default=min(32, (os.cpu_count() or 2) + 4),
        help="segments processed at once by the task bodies (Prefect's thread pool default)",
    )
    parser.add_argument("--no-flow", action="store_true", help="skip the Prefect flow measurement")
    parser.add_argument(
        "--flow", action="store_true", help="with --quick: measure the Prefect flow too (+~45 s server start)"
    )
    parser.add_argument(
        "--gray-only",
        action="store_true",
        help="only the whole-flow grayscale measurement against the bare ffmpeg script (no user path, no task bodies)",
    )
    parser.add_argument(
        "--model",
        action="store_true",
        help="only the text-redact backend's frames/s against the grayscale ffmpeg backend",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="with --model: frames per run of the detector")
    parser.add_argument(
        "--user-path",
        action="store_true",
        help="only the user's path (`deployment run` on a local stack's worker to final.mp4) against the bare script",
    )
    args = parser.parse_args()
    seconds = args.seconds or (12.0 if args.quick else 60.0)
    size = args.size or ("320x240" if args.quick else "1280x720")
    if args.model:  # no records, no server: the backends alone
        with tempfile.TemporaryDirectory(prefix="video-bench-") as tmp:
            source = make_source(Path(tmp) / "source.mp4", seconds, size, 30, args.segment_seconds / 2)
            print(f"source: {seconds:g} s {size} 30 fps; segments of {args.segment_seconds:g} s")
            model_vs_grayscale(source, Path(tmp), args.segment_seconds, os.cpu_count() or 2, args.batch_size)
        return
    repeat = args.repeat or (1 if args.quick else 3)
    modes = ["grayscale"] if args.quick else ["grayscale", "scale", "denoise"]

    with tempfile.TemporaryDirectory(prefix="video-bench-") as tmp, dynamodb_local():
        work = Path(tmp)
        os.environ["OBJECT_STORE_BASE_URL"] = (work / "objects").as_uri()
        os.environ["PIPELINES_USE_BLOCKS"] = "0"
        from benchmarks._common import ensure_table  # dropped again at the end
        from tasks.core.registry import default_table_names, table_specs

        suffix = uuid.uuid4().hex[:6]
        names = {logical: f"{name}-bench-{suffix}" for logical, name in default_table_names("bench").items()}
        for logical in table_specs():
            os.environ[f"TABLE_{logical.upper()}"] = names[logical]
        for logical in ("video_jobs", "video_segment_completions", "video_reassembly_locks"):
            ensure_table(names[logical], table_specs()[logical])

        t0 = time.perf_counter()
        source = make_source(work / "source.mp4", seconds, size, 30, args.segment_seconds / 2)
        from tasks.video.ffmpeg import probe

        info = probe(source)
        print(
            f"source: {seconds:g} s {size} 30 fps, {info.frames} frames, {source.stat().st_size / 1e6:.1f} MB "
            f"(generated in {time.perf_counter() - t0:.1f} s); segments of {args.segment_seconds:g} s"
        )

        if args.user_path or not (args.no_flow or args.gray_only):
            sources = {f"heavy clip, testsrc2 12 Mb/s {seconds:g} s {size}": source}
            if not args.quick:  # the light clip: the same length and size, a light encode, the same 15 segments
                light = make_light_source(work / "light.mp4", seconds, size, args.segment_seconds)
                sources[f"light clip, testsrc libx264 default rate {seconds:g} s {size}"] = light
            user_path_vs_bare(sources, work, args.segment_seconds, repeat, os.cpu_count() or 2)
        if args.user_path:
            return
        if not args.no_flow:
            whole_flow_vs_bare(source, work, args.segment_seconds, repeat, os.cpu_count() or 2)
        if args.gray_only:
            return
        raw, tasks_only, flow_times, phases = [], [], [], []
        pipeline_tasks(source, args.segment_seconds, args.workers)  # warm-up: imports, per-thread clients
        for _ in range(repeat):
            raw.append(raw_baseline(source, work / "raw", args.segment_seconds))
            elapsed, done = pipeline_tasks(source, args.segment_seconds, args.workers)
            tasks_only.append(elapsed)
            phases.append(done["phases"])
            assert done["frames"] == info.frames, (done["frames"], info.frames)
        print(f"raw ffmpeg segment+concat:        {spread(raw)}")
        print(
            f"pipeline task bodies:             {spread(tasks_only)}  "
            f"ratio {statistics.median(tasks_only) / statistics.median(raw):.2f}x (goal <= 1.3x)"
        )
        print(
            "  phases (median s): "
            + ", ".join(f"{name} {statistics.median(p[name] for p in phases):.2f}" for name in phases[0])
        )

        if not args.no_flow and (args.flow or not args.quick):
            from prefect.testing.utilities import prefect_test_harness

            t0 = time.perf_counter()
            with prefect_test_harness(server_startup_timeout=180):
                print(f"(prefect server started in {time.perf_counter() - t0:.1f} s, not counted)")
                pipeline_flow(source, args.segment_seconds)  # warm-up: imports, first task-run registration
                for _ in range(repeat):
                    raw_flow = raw_baseline(source, work / "raw", args.segment_seconds)
                    flow_times.append(pipeline_flow(source, args.segment_seconds)[0])
                    raw.append(raw_flow)
            print(
                f"pipeline video-process flow:      {spread(flow_times)}  "
                f"ratio {statistics.median(flow_times) / statistics.median(raw):.2f}x (goal <= 1.3x)"
            )

        cpus = os.cpu_count() or 2
        tp = backend_throughput(source, work, args.segment_seconds, modes, cpus)
        for mode, fps in tp["frames_per_s"].items():
            print(f"ffmpeg backend {mode:<10} {fps:7.1f} frames/s ({tp['frames']} frames {size}, {cpus} workers)")


if __name__ == "__main__":
    main()
