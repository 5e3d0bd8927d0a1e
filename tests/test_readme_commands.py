"""Every operations-CLI command the README shows parses with the CLI's own parser (placeholders filled in), and
the single-key commands take their key either way: positional or flag."""

from __future__ import annotations

import itertools
import json
import re
import shlex
from pathlib import Path

import pytest

from deployments import cli

README = Path(__file__).resolve().parents[1] / "README.md"
CLI_PREFIX = re.compile(r"^(?:python -m deployments\.cli|pipelines)\s+")
SYNTAX_ONLY = {"python -m deployments.cli …", "python -m deployments.cli <group> <command>"}  # prose about the CLI
EXAMPLES = {"D": "2026-02-01", "ARN": "arn:aws:states:us-east-1:1:execution:sm:e1"}  # else an UPPER_CASE word -> "x-1"


def _subcommands(parser) -> dict[str, dict]:
    """Group name -> {command name -> its parser} of the CLI."""
    groups = next(a for a in parser._actions if a.dest == "group").choices
    return {name: next(a for a in group._actions if a.dest == "command").choices for name, group in groups.items()}


def readme_commands() -> list[str]:
    """Every CLI command line in README.md: code spans and fenced lines that start with the CLI or one of its groups,
    or with one of its commands (a command written without its group, which the test then rejects)."""
    text = README.read_text()
    snippets = re.findall(r"`([^`\n]+)`", text) + [
        line for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S) for line in block.splitlines()]
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


def argv_variants(line: str) -> list[list[str]]:
    """The argument lists a README line stands for: placeholders filled in, each ``[optional part]`` with and without."""
    line = re.sub(r"<[^>]+>", "x-1", line).replace("…", "x")
    parts = re.split(r"\[([^\]]*)\]", line)  # even: always there; odd: optional
    variants = []
    for keep in itertools.product((False, True), repeat=len(parts) // 2):
        chosen = [part for index, part in enumerate(parts) if index % 2 == 0 or keep[index // 2]]
        words = shlex.split(" ".join(chosen))
        variants.append([EXAMPLES.get(w, "x-1") if re.fullmatch(r"[A-Z][A-Z0-9_]*", w) else w for w in words])
    return variants


def test_the_readme_shows_the_cli_commands_this_test_checks():
    lines = readme_commands()
    assert {"phspectra get-run RUN_ID", "records granule GRANULE_ID", "video create-job", "gpu tasks --job JOB_ID"} <= set(lines)
    assert len(lines) >= 20


@pytest.mark.parametrize("line", sorted(set(readme_commands())))
def test_each_readme_command_parses(line, capsys):
    parser = cli.build_parser()
    for argv in argv_variants(line):
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"README command `{line}` ({argv}) does not parse: {capsys.readouterr().err.strip()}")
        assert callable(args.handler)


def test_a_key_is_taken_positional_or_as_its_flag_and_a_missing_or_contradicting_one_is_refused(capsys):
    parser = cli.build_parser()
    for argv, key, value in ((["phspectra", "get-run", "R1"], "run_id", "R1"), (["phspectra", "get-run", "--run-id", "R1"], "run_id", "R1"),
                             (["phspectra", "get-run", "R1", "--run-id", "R1"], "run_id", "R1"),
                             (["records", "granule", "G1"], "granule_id", "G1"), (["gpu", "tasks", "--job", "J1"], "job_id", "J1"),
                             (["gpu", "tasks", "J1"], "job_id", "J1"), (["records", "dla-show", "msg-1"], "id", "msg-1")):
        args = vars(parser.parse_args(argv))
        assert args[key] == value and f"{key}_positional" not in args
    for argv, error in ((["phspectra", "get-run"], "give RUN_ID or --run-id RUN_ID"),
                        (["records", "granule", "G1", "--granule-id", "G2"], "GRANULE_ID 'G1' and --granule-id 'G2' differ: give one")):
        with pytest.raises(SystemExit) as raised:
            parser.parse_args(argv)
        assert raised.value.code == 2 and capsys.readouterr().err.strip().endswith(error)


def test_the_readme_commands_get_run_and_granule_run_in_both_forms(tables, store_root, capsys):
    """On DynamoDB Local: `phspectra get-run RUN_ID` and `records granule GRANULE_ID`, positional and as flags."""
    from tasks.core import state_store
    from tasks.core.runtime import now_iso
    from tasks.phspectra import survey
    from tasks.records import messages as records_messages
    from test_records import message

    state_store.create_if_absent(tables["phspectra_runs"], {**survey.run_key("run-7"), "status": survey.RUN_RUNNING,
                                                            "survey": "grs", "jobs_total": 2, "created_at": now_iso()}, ["PK", "SK"])
    records_messages.ingest([json.dumps(message("completed", "exec-1", 1000, granule="G7"))])
    outputs = {}
    for argv in (["phspectra", "get-run", "run-7"], ["phspectra", "get-run", "--run-id", "run-7"],
                 ["records", "granule", "G7"], ["records", "granule", "--granule-id", "G7"]):
        assert cli.main(argv) == 0, capsys.readouterr().err
        outputs[tuple(argv)] = json.loads(capsys.readouterr().out)
    run, granule = outputs[("phspectra", "get-run", "run-7")], outputs[("records", "granule", "G7")]
    assert (run["status"], run["jobs_total"]) == ("RUNNING", 2) and outputs[("phspectra", "get-run", "--run-id", "run-7")] == run
    assert (granule["granuleId"], granule["status"]) == ("G7", "completed")
    assert outputs[("records", "granule", "--granule-id", "G7")] == granule
    assert cli.main(["records", "granule", "G-none"]) == 2 and "no granules record" in capsys.readouterr().err
