"""Releases: which commit each version is (releases.json), what CHANGELOG.md tells an operator per release, and the
data folder's stamp of the version that last ran `make up` on it.

A clone need not carry tags, so releases.json and main's history are the record; the tags are a convenience.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tasks.core.release import VERSION

REPO_ROOT = Path(__file__).resolve().parents[1]
RELEASES_FILE = REPO_ROOT / "releases.json"
CHANGELOG = REPO_ROOT / "CHANGELOG.md"
STAMP_NAME = "stack-version.json"
# a release heading: "## v0.2.0 ..." (the version first, anything after it)
_HEADING = re.compile(r"^## v(\d+\.\d+\.\d+)\b")


def version_key(version: str) -> tuple[int, ...]:
    """A version as numbers, to order releases (``0.10.0`` after ``0.9.0``)."""
    return tuple(int(part) for part in version.split("."))


def releases() -> dict[str, str | None]:
    """releases.json's version -> commit (null for the release this tree is, not tagged yet), oldest first."""
    recorded = json.loads(RELEASES_FILE.read_text())["releases"]
    return dict(sorted(recorded.items(), key=lambda item: version_key(item[0])))


def release_commit(version: str) -> str:
    """The commit of a published release; a LookupError for a version releases.json does not give a commit."""
    commit = releases().get(version)
    if not commit:
        raise LookupError(f"no commit recorded for v{version} in {RELEASES_FILE.name}")
    return commit


def code_identity() -> str:
    """This code's version and, in a git checkout, its commit: what a supervised program's configuration carries so
    that new code (a `git pull`) restarts it at the next `make up`."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{VERSION}+{commit}" if commit else VERSION


def changelog_sections(text: str | None = None) -> dict[str, str]:
    """CHANGELOG.md's release sections, version -> the section's text (its heading line left out)."""
    text = CHANGELOG.read_text() if text is None else text
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            match = _HEADING.match(line)
            current = sections.setdefault(match.group(1), []) if match else None
        elif current is not None:
            current.append(line)
    return {version: "\n".join(lines).strip() for version, lines in sections.items()}


def operator_steps(written_by: str | None, running: str = VERSION, text: str | None = None) -> list[str]:
    """The CHANGELOG's **Do:** items of each release after ``written_by`` up to ``running`` (every release up to it
    when ``written_by`` is None), oldest release first, each prefixed with its release."""
    floor = version_key(written_by) if written_by else ()
    steps = []
    for version, section in sorted(changelog_sections(text).items(), key=lambda item: version_key(item[0])):
        if floor < version_key(version) <= version_key(running):
            steps += [
                f"v{version}: {item.split('**Do:**', 1)[1].strip()}" for item in _items(section) if "**Do:**" in item
            ]
    return steps


def _items(section: str) -> list[str]:
    """A section's list items, each with its wrapped lines joined (a sub-item is an item of its own)."""
    items: list[str] = []
    for line in section.splitlines():
        stripped = line.strip()
        if stripped.startswith("- ") or not items or not stripped or stripped.startswith("#"):
            items.append(stripped.removeprefix("- "))
        else:
            items[-1] += " " + stripped
    return [item for item in items if item]


def read_stamp(data: Path) -> str | None:
    """The version the stamp in a data folder names, or None where there is none."""
    try:
        return str(json.loads((data / STAMP_NAME).read_text())["version"])
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def inferred_version(data: Path) -> str | None:
    """The version that wrote a data folder: its stamp; for one from before the stamps, what its files show (the
    launch key came with v0.2.0; a stack folder without it is v0.1.0's); None for a folder no stack has used."""
    stamped = read_stamp(data)
    if stamped:
        return stamped
    if (data / "secrets" / "launch-key").exists():
        return "0.2.0"
    if (data / "dynamodb").is_dir() or (data / "supervisor").is_dir():
        return "0.1.0"
    return None


def write_stamp(data: Path) -> None:
    """Stamp a data folder with the version (and commit) that ran `make up` on it, whole or not at all: staged beside
    it, synced to the disk and renamed over the last one (the local object store's write), so a crash leaves the old
    stamp or the new one, never a torn file (which the next `up` would read as no stamp, and take the folder for an
    older release's)."""
    from tasks.core.object_store import LocalStore

    data.mkdir(parents=True, exist_ok=True)
    stamp = json.dumps({"version": VERSION, "code": code_identity()}) + "\n"
    LocalStore(data).put_bytes(STAMP_NAME, stamp.encode())


def upgrade_notice(data: Path) -> list[str]:
    """What `make up` tells the operator before it starts a stack whose data another version wrote: which version,
    and what the CHANGELOG says to do. Empty for a new folder or the same version. Never a refusal: the stack starts
    and upgrades (or runs older code on newer data, which the notice says)."""
    written_by = inferred_version(data)
    if written_by is None or written_by == VERSION:
        return []
    how = "stamped" if read_stamp(data) else "inferred: the folder has no stamp"
    if version_key(written_by) > version_key(VERSION):
        return [
            f"NOTE: this stack's data was written by v{written_by} ({how}); this code is v{VERSION}, older. It starts; "
            f"what v{written_by} changed may not be understood. CHANGELOG.md says what each release changed."
        ]
    lines = [f"NOTE: this stack's data was written by v{written_by} ({how}); upgrading it to v{VERSION}."]
    steps = operator_steps(written_by)
    lines += [f"  CHANGELOG.md, to do: {step}" for step in steps] or [
        f"  CHANGELOG.md lists nothing to do between v{written_by} and v{VERSION}."
    ]
    return lines
