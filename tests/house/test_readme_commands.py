"""The README is a front door and the documentation's commands work: every operations-CLI command shown in README.md
or docs/*.md parses with the CLI's own parser (placeholders filled in), the single-key commands take their key either
way (positional or flag), the README stays short, and every docs/*.md page it links to exists."""

from __future__ import annotations

import itertools
import json
import re
import shlex
import unicodedata
from pathlib import Path

import pytest

from deployments import cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 200
CLI_PREFIX = re.compile(r"^(?:python -m deployments\.cli|pipelines)\s+")
SYNTAX_ONLY = {"python -m deployments.cli …", "python -m deployments.cli <group> <command>"}  # prose about the CLI
EXAMPLES = {"D": "2026-02-01", "ARN": "arn:aws:states:us-east-1:1:execution:sm:e1"}  # else an UPPER_CASE word -> "x-1"
LINK = re.compile(r"\]\(((?:docs/)?[\w.-]+\.md)(?:#([^)\s]*))?\)")


def documentation() -> list[Path]:
    """The pages whose commands are checked: README.md and every docs/*.md."""
    return [README, *sorted(DOCS.glob("*.md"))]


def _subcommands(parser) -> dict[str, dict]:
    """Group name -> {command name -> its parser} of the CLI ({} for a command of the CLI's own, e.g. `backup`)."""
    groups = next(a for a in parser._actions if a.dest == "group").choices
    return {
        name: next((a.choices for a in group._actions if a.dest == "command"), {}) for name, group in groups.items()
    }


def page_commands(page: Path) -> list[str]:
    """Every CLI command line in ``page``: code spans and fenced lines that start with the CLI or one of its groups,
    or with one of its commands (a command written without its group, which the test then rejects)."""
    text = page.read_text()
    snippets = re.findall(r"`([^`\n]+)`", text) + [
        line for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S) for line in block.splitlines()
    ]
    groups = _subcommands(cli.build_parser())
    commands = {name for group in groups.values() for name in group} - set(groups)
    found = []
    for snippet in snippets:
        line = snippet.split(" #")[0].strip()
        words = line.split()
        if line in SYNTAX_ONLY or not words:
            continue
        if CLI_PREFIX.match(line) or (len(words) > 1 and words[0] in groups) or words[0] in commands and len(words) > 1:
            found.append(CLI_PREFIX.sub("", line))
    return found


def documented_commands() -> list[tuple[str, str]]:
    """(page relative to the repository, command line) for every CLI command the documentation shows, once each."""
    return sorted({(str(page.relative_to(ROOT)), line) for page in documentation() for line in page_commands(page)})


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives ``page``'s headings: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        kept = "".join(c for c in heading.lower() if c in " -_" or unicodedata.category(c)[0] in "LN")
        anchors.add(kept.replace(" ", "-"))
    return anchors


def argv_variants(line: str) -> list[list[str]]:
    """The argument lists a documented line stands for: placeholders filled in, each ``[optional]`` in and out."""
    line = re.sub(r"<[^>]+>", "x-1", line).replace("…", "x")
    parts = re.split(r"\[([^\]]*)\]", line)  # even: always there; odd: optional
    variants = []
    for keep in itertools.product((False, True), repeat=len(parts) // 2):
        chosen = [part for index, part in enumerate(parts) if index % 2 == 0 or keep[index // 2]]
        words = shlex.split(" ".join(chosen))
        variants.append([EXAMPLES.get(w, "x-1") if re.fullmatch(r"[A-Z][A-Z0-9_]*", w) else w for w in words])
    return variants


def test_the_documentation_shows_the_cli_commands_this_test_checks():
    lines = {line for _, line in documented_commands()}
    shown = {"phspectra get-run RUN_ID", "records granule GRANULE_ID", "video create-job", "gpu tasks --job JOB_ID"}
    assert shown <= lines
    assert len(lines) >= 20
    assert {"etl status --date 2026-02-01", "video create-job"} <= set(page_commands(README))


@pytest.mark.parametrize(("page", "line"), documented_commands())
def test_each_documented_command_parses(page, line, capsys):
    parser = cli.build_parser()
    for argv in argv_variants(line):
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page}: command `{line}` ({argv}) does not parse: {capsys.readouterr().err.strip()}")
        assert callable(args.handler)


def test_the_readme_is_a_front_door_of_at_most_200_lines():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail into docs/"


def test_every_docs_page_the_readme_links_to_exists_and_every_docs_page_is_linked():
    linked = {target for target, _ in LINK.findall(README.read_text()) if target.startswith("docs/")}
    assert linked, "the README links no docs/*.md page"
    assert not {target for target in linked if not (ROOT / target).is_file()}
    assert {f"docs/{page.name}" for page in DOCS.glob("*.md")} <= linked


def test_every_link_between_the_pages_names_a_page_and_a_heading_that_exist():
    broken = []
    for page in documentation():
        for target, anchor in LINK.findall(page.read_text()):
            path = (page.parent / target).resolve()
            if not path.is_file() or anchor and anchor not in heading_anchors(path):
                broken.append(f"{page.relative_to(ROOT)} -> {target}{'#' + anchor if anchor else ''}")
    assert not broken


def test_a_key_is_taken_positional_or_as_its_flag_and_a_missing_or_contradicting_one_is_refused(capsys):
    parser = cli.build_parser()
    for argv, key, value in (
        (["phspectra", "get-run", "R1"], "run_id", "R1"),
        (["phspectra", "get-run", "--run-id", "R1"], "run_id", "R1"),
        (["phspectra", "get-run", "R1", "--run-id", "R1"], "run_id", "R1"),
        (["records", "granule", "G1"], "granule_id", "G1"),
        (["gpu", "tasks", "--job", "J1"], "job_id", "J1"),
        (["gpu", "tasks", "J1"], "job_id", "J1"),
        (["records", "dla-show", "msg-1"], "id", "msg-1"),
    ):
        args = vars(parser.parse_args(argv))
        assert args[key] == value and f"{key}_positional" not in args
    for argv, error in (
        (["phspectra", "get-run"], "give RUN_ID or --run-id RUN_ID"),
        (["records", "granule", "G1", "--granule-id", "G2"], "GRANULE_ID 'G1' and --granule-id 'G2' differ: give one"),
    ):
        with pytest.raises(SystemExit) as raised:
            parser.parse_args(argv)
        assert raised.value.code == 2 and capsys.readouterr().err.strip().endswith(error)


def test_the_readme_commands_get_run_and_granule_run_in_both_forms(tables, store_root, capsys):
    """On DynamoDB Local: `phspectra get-run RUN_ID` and `records granule GRANULE_ID`, positional and as flags."""
    from tasks.core import state_store
    from tasks.core.runtime import now_iso
    from tasks.phspectra import survey
    from tasks.records import messages as records_messages
    from tests.helpers.records import message

    state_store.create_if_absent(
        tables["phspectra_runs"],
        {
            **survey.run_key("run-7"),
            "status": survey.RUN_RUNNING,
            "survey": "grs",
            "jobs_total": 2,
            "created_at": now_iso(),
        },
        ["PK", "SK"],
    )
    records_messages.ingest([json.dumps(message("completed", "exec-1", 1000, granule="G7"))])
    outputs = {}
    for argv in (
        ["phspectra", "get-run", "run-7"],
        ["phspectra", "get-run", "--run-id", "run-7"],
        ["records", "granule", "G7"],
        ["records", "granule", "--granule-id", "G7"],
    ):
        assert cli.main(argv) == 0, capsys.readouterr().err
        outputs[tuple(argv)] = json.loads(capsys.readouterr().out)
    run, granule = outputs[("phspectra", "get-run", "run-7")], outputs[("records", "granule", "G7")]
    assert (run["status"], run["jobs_total"]) == ("RUNNING", 2) and outputs[
        ("phspectra", "get-run", "--run-id", "run-7")
    ] == run
    assert (granule["granuleId"], granule["status"]) == ("G7", "completed")
    assert outputs[("records", "granule", "--granule-id", "G7")] == granule
    assert cli.main(["records", "granule", "G-none"]) == 2 and "no granules record" in capsys.readouterr().err
