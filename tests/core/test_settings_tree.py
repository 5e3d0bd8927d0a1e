"""One settings tree (issue 54 item 5): every variable the project reads comes from a settings class whose prefix
follows one rule, every field carries its default and description, and docs/operations.md's configuration tables are
the rendering of those descriptions."""

from __future__ import annotations

import ast

import pytest

from blocks.base import ConfigBlock
from blocks.settings import EnvSettings, env_prefix
from deployments import settings_docs
from deployments.generated_part import MarkersMissing
from deployments.settings import StackSettings
from deployments.settings_tree import settings_classes
from tests.helpers.house import modules

# variables read outside the tree, each with why it is no setting of ours
NOT_OURS = {
    "XDG_RUNTIME_DIR": "the OS's per-user runtime folder (XDG base directories)",
    "AWS_ENDPOINT_URL": "boto3's",
    "AWS_ENDPOINT_URL_S3": "boto3's",
    "AWS_ENDPOINT_URL_DYNAMODB": "boto3's (the local stack sets it; its presence says DynamoDB is local)",
    "AWS_REGION": "boto3's",
    "AWS_DEFAULT_REGION": "boto3's",
    "PREFECT_API_URL": "Prefect's",
    "PREFECT_API_KEY": "Prefect's",
    "DOCKER_HOST": "Docker's",
    "LISTEN_FDS": "the socket-activation handshake between held_port and the child it starts",
    "PHSPECTRA_FORKSERVER_PARENT": "handed by the phspectra worker to the fork server it starts, never by a person",
    "PHSPECTRA_FORKSERVER_KEY": "handed by the phspectra worker to the fork server it starts, never by a person",
    "NODE_NAME": "the GPU job contract: the backend sets it for a job's command (deployments/samples/gpu.py is one)",
    "NODE_INDEX": "the GPU job contract",
    "GPU_JOB_NUM_NODES": "the GPU job contract",
    "GPU_JOB_ID": "the GPU job contract",
    "GPU_JOB_RETRY": "the GPU job contract",
}
# modules that read variables named at run time, each with why
READS_BY_LIST = {
    "tasks.gpu.backends": "hands a job the worker's variables GpuCompute.env_passthrough lists",
    "deployments.backup": "saves and restores the variables it changes around a restore",
}
THE_TREE_READER = "blocks.settings"  # read_env: every class reads through it

# every name the project read before the tree (and the deploy, the Dockerfile and users set): all still read
NAMES_BEFORE = [
    *("PIPELINES_CPU_HEAVY_SLOTS", "PIPELINES_CPU_SLOTS_DIR", "PIPELINES_RUNTIME_DIR", "PIPELINES_DATA_DIR"),
    *("PIPELINES_NOTIFY_BLOCK", "PIPELINES_LAUNCH_KEY", "PIPELINES_LAUNCH_KEY_PREVIOUS", "PIPELINES_FAULT"),
    *("PIPELINES_FAULT_LOG", "PIPELINES_USE_BLOCKS", "PIPELINES_LISTENER_HEARTBEAT", "PIPELINES_METRICS_ENV"),
    *("PIPELINES_API_CLIENT_PORT", "PIPELINES_PREFECT_RETENTION_DAYS", "PIPELINES_DYNAMODB_KEY_GRACE_S"),
    *("PIPELINES_DYNAMODB_KEYS", "PIPELINES_<PIPELINE>_QUEUE_URL", "OBJECT_STORE_MULTIPART_MB", "VIDEO_MODEL_THREADS"),
    *("DYNAMODB_LOCAL_PORT", "DYNAMODB_LOCAL_ISOLATE", "PREFECT_SERVER_PORT", "PREFECT_SERVER_DB"),
    *("PREFECT_POSTGRES_PORT", "LOCAL_WORK_POOL", "ECS_WORK_POOL", "MAINTENANCE_WORK_POOL"),
    *("TABLE_ENV", "TABLE_<LOGICAL>", "OBJECT_STORE_BASE_URL", "ETL_TTL_DAYS", "TTL_DAYS", "GPU_BACKEND"),
    *("HEALTH_DISK_PATHS", "VIDEO_INFERENCE_API_KEY", "VIDEO_INFERENCE_SOURCE_PREFIXES"),
]


def names_of(cls: type) -> dict[str, str]:
    """Every variable ``cls`` reads -> what sets it there (a field, an alias's field, a pattern)."""
    names = {cls.env_name(field): field for field in cls.model_fields if _read_from_env(cls, field)}
    names |= {alias: f"{field} (alias)" for alias, field in cls._env_aliases.items()}
    names |= {cls.pattern_name(pattern): pattern for pattern in cls._env_patterns}
    return names


def _read_from_env(cls: type, field: str) -> bool:
    return not issubclass(cls, ConfigBlock) or cls.env_type(field) is not None


def every_name() -> dict[str, str]:
    """Variable -> its class, over the whole tree; a name two classes read is a failure of its own."""
    owners: dict[str, str] = {}
    for cls in settings_classes():
        for name in names_of(cls):
            assert name not in owners, f"{name}: {owners[name]} and {cls.__name__}"
            owners[name] = cls.__name__
    return owners


def _constant(node: ast.expr, constants: dict[str, str]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    return None


def _is_environ(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "environ" and getattr(node.value, "id", None) == "os"


def direct_reads(source: str) -> list[str | None]:
    """The variables a module reads from ``os.environ``/``getenv`` itself: their names, None for a name computed."""
    tree = ast.parse(source)
    constants = {
        target.id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    keys: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in ("get", "pop") and _is_environ(func.value):
                keys.append(node.args[0])
            elif (isinstance(func, ast.Attribute) and func.attr == "getenv") or getattr(func, "id", None) == "getenv":
                keys.append(node.args[0])
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            keys.append(node.slice)
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            keys.append(node.left)
    return [_constant(key, constants) for key in keys]


def test_the_scan_finds_each_way_of_reading_a_variable():
    source = (
        'import os\nNAME = "B"\nos.environ.get("A")\nos.environ[NAME]\nos.getenv("C")\n"D" in os.environ\n'
        'os.environ.pop(f"{x}")\nos.environ["W"] = "1"\n'
    )
    assert direct_reads(source) == ["A", "B", "C", "D", None]


def test_no_module_reads_a_variable_of_ours_but_through_the_settings_tree():
    wrong = []
    for module, path in modules().items():
        if module == THE_TREE_READER:
            continue
        for name in direct_reads(path.read_text()):
            if name is None and module not in READS_BY_LIST:
                wrong.append(f"{module}: a variable named at run time")
            elif name is not None and name not in NOT_OURS:
                wrong.append(f"{module}: {name}")
    assert wrong == []


def test_every_name_read_before_the_tree_is_still_read():
    assert sorted(set(NAMES_BEFORE) - set(every_name())) == []


def test_every_field_has_a_description_and_every_class_a_summary():
    missing = [
        f"{cls.__name__}.{field}"
        for cls in settings_classes()
        for field, info in cls.model_fields.items()
        if not (info.description or "").strip()
    ]
    assert missing == []
    assert [cls.__name__ for cls in settings_classes() if not (cls.__doc__ or "").strip()] == []


def test_every_prefix_follows_the_one_rule_and_keeps_its_value():
    prefixes = {cls.__name__: env_prefix(cls) for cls in settings_classes()}
    assert {name: prefixes[name] for name in ("EtlSettings", "GpuCompute", "HealthThresholds", "VideoSettings")} == {
        "EtlSettings": "ETL_",
        "GpuCompute": "GPU_",
        "HealthThresholds": "HEALTH_",
        "VideoSettings": "VIDEO_",
    }
    blocks = [cls for cls in settings_classes() if issubclass(cls, ConfigBlock)]
    assert [cls.__name__ for cls in blocks if cls._env_prefix != env_prefix(cls)] == []


def test_every_alias_names_a_field_and_no_two_classes_read_one_name():
    for cls in settings_classes():
        assert set(cls._env_aliases.values()) <= set(cls.model_fields), cls
    assert len(every_name()) > len(NAMES_BEFORE)  # every_name fails on a name two classes read


def test_a_class_outside_blocks_and_tasks_must_declare_its_scope():
    class Loose(EnvSettings):
        """A class in a test module."""

    with pytest.raises(TypeError, match="declare _env_scope"):
        Loose.env_name("x")


def test_settings_are_read_at_each_call_and_an_empty_variable_is_unset(monkeypatch):
    from tasks.core import limits
    from tasks.video.settings import VideoSettings

    monkeypatch.setenv("PIPELINES_CPU_HEAVY_SLOTS", "3")
    monkeypatch.setenv("VIDEO_MODEL_THREADS", "2")
    assert (limits.cpu_heavy_slots(), VideoSettings.read().model_threads) == (3, 2)
    monkeypatch.setenv("PIPELINES_CPU_HEAVY_SLOTS", "5")
    monkeypatch.setenv("VIDEO_MODEL_THREADS", "")
    assert (limits.cpu_heavy_slots(), VideoSettings.read().model_threads) == (5, None)


def test_an_old_name_is_an_alias_the_new_name_wins_over(monkeypatch, caplog):
    monkeypatch.delenv("PIPELINES_ECS_WORK_POOL", raising=False)
    monkeypatch.setenv("ECS_WORK_POOL", "old-pool")
    assert StackSettings.read().ecs_work_pool == "old-pool"
    monkeypatch.setenv("PIPELINES_ECS_WORK_POOL", "new-pool")
    assert StackSettings.read().ecs_work_pool == "new-pool"
    assert "PIPELINES_ECS_WORK_POOL='new-pool' wins over its alias ECS_WORK_POOL='old-pool'" in caplog.text


def test_the_configuration_section_is_the_rendering_of_the_descriptions():
    text = settings_docs.DOC.read_text()
    assert settings_docs.render(text) == text, "run pipelines generate"


def test_the_rendering_replaces_only_what_lies_between_the_markers():
    text = f"before\n{settings_docs.BEGIN}\nstale\n{settings_docs.END}\nafter\n"
    rendered = settings_docs.render(text)
    assert rendered == f"before\n{settings_docs.BEGIN}\n\n{settings_docs.rendering()}\n{settings_docs.END}\nafter\n"
    assert "| `VIDEO_MODEL_THREADS` | int | unset |" in rendered
    assert "| `PIPELINES_ECS_WORK_POOL` (also `ECS_WORK_POOL`) | str | `aws-ecs` |" in rendered
    with pytest.raises(MarkersMissing):
        settings_docs.render("no markers")


def test_reading_settings_leaves_prefect_unimported_in_a_light_process():
    """The relay, the supervisor and a listener's health check read settings and never load a block: reading them
    imports no Prefect (blocks/__init__ imports the block modules at the first block asked for). `make up` computes
    the stack's environment before its first Prefect client: Prefect reads its settings once, at its import."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "import deployments.dynamodb_local, deployments.local_stack, tasks.core.limits, tasks.landing.heartbeat\n"
        "tasks.core.limits.cpu_heavy_slots(); deployments.dynamodb_local.DynamoDbLocal.read()\n"
        "deployments.local_stack.local_env()\n"
        "print('prefect' in sys.modules)\n"
        "import blocks; blocks.EtlSettings\n"
        "print('prefect' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["False", "True"]
