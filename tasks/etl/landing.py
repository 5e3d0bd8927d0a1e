"""The ETL listener's handler: one micro-batch of landed files through the ingest's own steps, callable
without Prefect.

    arrivals ─┬─ outside pipeline/input/ ──────────────> acked, logged ("outside_prefix")
              └─ validate_files ─┬─ gone since ───────> acked, logged ("missing")
                                 ├─ refused ──────────> quarantine_files ("quarantined")
                                 └─ valid ────────────> track_and_batch + create_manifests ─> launch merges
                                                        ("tracked", or "already_tracked" for a repeat)
    DynamoDB or the store unreachable ──> Outcome.retry (offered again; nothing half done is lost: every
                                          write is create-if-absent or guarded, so the retry finishes it)

One Prefect event per outcome of a batch (naming its files, related to the merge runs they started), one log line a
file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlparse

from botocore.exceptions import BotoCoreError, ClientError

from blocks.etl import EtlSettings
from tasks.core.runtime import run_logger
from tasks.etl import ingest as etl
from tasks.etl import keys
from tasks.etl.ingest import FileCheck, ManifestRef
from tasks.landing.listener import Outcome, emit_landed
from tasks.landing.sources import Arrival

PIPELINE = "etl"


def input_store_url() -> str:
    """The URL of the store ETL input lands in: ``EtlSettings.input_store_url``, else the pipeline object store."""
    from blocks import load_config
    from tasks.core.config import object_store

    return object_store(load_config(EtlSettings).input_store_url or None).url


TRACKED, ALREADY_TRACKED, QUARANTINED, MISSING, OUTSIDE = (
    "tracked",
    "already_tracked",
    "quarantined",
    "missing",
    "outside_prefix",
)
TRANSIENT = (BotoCoreError, ClientError, OSError)  # DynamoDB or the object store unreachable, throttled, timing out

Launch = Callable[[list[ManifestRef]], list[dict[str, Any]]]


class ManifestFill:
    """The listener's count of the files it handed over that wait for their manifest's last: a batch that fills a
    manifest goes to the ingest at once instead of at its window's end (the seed's 10-file batches, less a window's
    wait a file). A guess from what the listener saw (a file of another listener or date counts wrongly): it only
    moves when a batch goes, never what becomes of it, and the window still bounds every batch."""

    def __init__(self, files_per_manifest: int) -> None:
        self.size = max(1, files_per_manifest)
        self.waiting = 0

    def full(self, batch: Sequence[Arrival]) -> bool:
        """Whether ``batch`` fills the manifest its files go to."""
        return self.waiting + len(batch) >= self.size

    def handled(self, outcome: Outcome) -> Outcome:
        """Count a handled batch's files (those it made manifests of are not waiting any more); ``outcome`` as is."""
        self.waiting = (self.waiting + len(outcome.done)) % self.size
        return outcome


def under_input_prefix(arrival: Arrival) -> bool:
    """Whether the object lies under some ``…/pipeline/input/`` (else no pipeline knows it)."""
    return f"/{keys.INPUT_PREFIX}" in "/" + urlparse(arrival.url).path.lstrip("/")


def is_missing(check: FileCheck) -> bool:
    """The file parsed but could not be looked at: it was deleted (or moved) after it landed."""
    return check.size is None and check.date_prefix != keys.UNDATED_PREFIX


def ingest_landed(checks: Sequence[FileCheck], config: EtlSettings, launch: Launch) -> dict[str, Any]:
    """The ingest's steps for one batch of checked files: quarantine the refused, track and batch the valid
    (claim-first), start the merges. Returns which files were tracked before, and the launches."""
    refused = [c for c in checks if not c.valid]
    valid = [c for c in checks if c.valid]
    before = etl.tracked_items((c.date_prefix, c.file_key) for c in checks)
    quarantined = etl.quarantine_files(refused, config) if refused else []
    tracked = etl.track_and_batch(valid, config, existing=before)
    made: list[ManifestRef] = list(tracked["manifests"])
    # a date is batched again only where this batch left files pending (new ones, or ones a killed run tracked):
    # repeats of files already in manifests (a restarted listener's catch-up listing) have nothing to claim
    pending = {d for d, keys_ in tracked["new_files"].items() if keys_}
    pending |= {d for (d, _), item in before.items() if etl.base_status(item) == etl.PENDING}
    for date_prefix in [d for d in tracked["dates"] if d in pending]:
        made += etl.create_manifests(
            date_prefix, config.max_files_per_manifest, config, prefer=tracked["new_files"].get(date_prefix, [])
        )
    return {"before": before, "quarantined": quarantined, "tracked": tracked, "launches": launch(made) if made else []}


def _merge_runs(checks: Sequence[FileCheck], launches: Sequence[dict[str, Any]]) -> dict[tuple[str, str], str]:
    """(date, file key) -> id of the merge run started for the manifest that holds the file, where one was."""
    runs = {launch["manifest_path"]: launch["run"] for launch in launches if launch.get("run")}
    if not runs:
        return {}
    items = etl.tracked_items((c.date_prefix, c.file_key) for c in checks)
    return {pair: runs[item["manifest_path"]] for pair, item in items.items() if item.get("manifest_path") in runs}


def handle_landed(arrivals: Sequence[Arrival], config: EtlSettings, launch: Launch) -> Outcome:
    """Validate → track → claim-first batching → merges for a micro-batch of landed files (never one run per
    file); done: every arrival whose file is tracked, quarantined, already tracked, gone or unknown; retry:
    the batch, when DynamoDB or the store could not be reached."""
    logger = run_logger(__name__)
    outcome = Outcome()
    labels: dict[int, str] = {}
    inside = []
    for arrival in arrivals:
        if under_input_prefix(arrival):
            inside.append(arrival)
        else:
            logger.warning("%s: outside every known prefix (%sYYYY-MM-DD/): ignored", arrival.url, keys.INPUT_PREFIX)
            labels[id(arrival)] = OUTSIDE
    checks = etl.validate_files([a.url for a in inside], config)
    present = [(a, c) for a, c in zip(inside, checks) if not is_missing(c)]
    for arrival, check in zip(inside, checks):
        if is_missing(check):
            logger.warning("%s: missing (deleted since it landed): nothing to do", arrival.url)
            labels[id(arrival)] = MISSING
    try:
        result = ingest_landed([c for _, c in present], config, launch)
    except TRANSIENT as error:
        reason = f"{type(error).__name__}: {error}"
        logger.warning("could not track %d landed file(s), offering them again: %s", len(present), reason)
        outcome.retry = [(a, reason) for a, _ in present]
        present = []
        result = {"before": {}, "launches": []}
    runs = _merge_runs([c for _, c in present], result["launches"])
    seen: set[tuple[str, str]] = set()
    run_of: dict[int, str] = {}
    for arrival, check in present:
        pair = (check.date_prefix, check.file_key)
        if pair in runs and pair not in seen:
            run_of[id(arrival)] = runs[pair]
        if pair in result["before"] or pair in seen:  # a normal repeat: counted in the batch's line
            logger.debug(
                "%s: already tracked (%s): nothing to do",
                arrival.url,
                result["before"][pair]["status"] if pair in result["before"] else "a repeat in this batch",
            )
            labels[id(arrival)] = ALREADY_TRACKED
        elif not check.valid:
            logger.warning("%s: quarantined: %s", arrival.url, check.reason)
            labels[id(arrival)] = QUARANTINED
        else:
            logger.debug("%s: tracked (%s)", arrival.url, check.date_prefix)
            labels[id(arrival)] = TRACKED
        seen.add(pair)
    counts = Counter(labels.values())
    # one line per batch with its counts (a log line per file was most of the listener's Prefect log budget); each
    # file that needs a person's eye has its own warning above, and the batch's event names every file
    logger.info(
        "%d landed file(s): %s", len(arrivals), ", ".join(f"{n} {label}" for label, n in sorted(counts.items()))
    )
    if present:  # the same metrics row as an ndjson-ingest run: the dashboard's files per hour
        etl.record_metric(
            "ingest",
            {
                "files": len(present),
                "tracked": counts[TRACKED],
                "quarantined": counts[QUARANTINED],
                "already_tracked": counts[ALREADY_TRACKED],
                "source": "listener",
            },
            config,
        )
    outcome.done = [arrival for arrival in arrivals if id(arrival) in labels]
    emit_landed(PIPELINE, [(a, labels[id(a)], [run_of[id(a)]] if id(a) in run_of else []) for a in outcome.done])
    return outcome
