"""Settings from the environment (issue 41 item 4): every pipeline's names carry its prefix, so they cannot collide
with another tool's; seed 001's own Lambda variable names stay as the ETL's listed aliases; the prefixed name wins."""

from __future__ import annotations

import logging

import pytest

import blocks
from blocks import ConfigBlock
from blocks.etl import EtlSettings
from tasks.core import limits


@pytest.fixture
def clean_env(monkeypatch):
    """No ETL setting in the environment, prefixed or not, whatever the caller's shell holds."""
    for field in EtlSettings.model_fields:
        for name in (f"ETL_{field}".upper(), field.upper()):
            monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_prefixed_name_sets_a_field(clean_env):
    clean_env.setenv("ETL_TTL_DAYS", "7")
    clean_env.setenv("ETL_CATALOG_DATABASE", "mine")
    assert EtlSettings.env_overrides() == {"ttl_days": 7, "catalog_database": "mine"}
    assert blocks.load_config(EtlSettings).ttl_days == 7


def test_the_seeds_name_still_sets_its_field(clean_env):
    clean_env.setenv("TTL_DAYS", "9")
    clean_env.setenv("MAX_FILES_PER_MANIFEST", "25")
    assert EtlSettings.env_overrides() == {"ttl_days": 9, "max_files_per_manifest": 25}


def test_the_prefixed_name_wins_over_the_alias_and_says_so(clean_env, caplog):
    clean_env.setenv("ETL_TTL_DAYS", "7")
    clean_env.setenv("TTL_DAYS", "9")
    with caplog.at_level(logging.WARNING, logger="blocks.base"):
        assert EtlSettings.env_overrides() == {"ttl_days": 7}
    assert "ETL_TTL_DAYS='7' wins over its alias TTL_DAYS='9'" in caplog.text
    clean_env.setenv("TTL_DAYS", "7")  # the same value twice: nothing to say
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="blocks.base"):
        assert EtlSettings.env_overrides() == {"ttl_days": 7}
    assert not caplog.text


@pytest.mark.parametrize("name", ["TARGET_FILE_MB", "CATALOG_DATABASE", "NOTIFY_BLOCK", "OUTPUT_STORE_URL"])
def test_a_field_without_a_seed_alias_ignores_its_bare_name(clean_env, name):
    clean_env.setenv(name, "0")
    assert EtlSettings.env_overrides() == {}


def test_every_block_has_its_own_prefix_and_its_aliases_name_fields():
    classes = [c for c in vars(blocks).values() if isinstance(c, type) and issubclass(c, ConfigBlock)]
    classes.remove(ConfigBlock)
    prefixes = [c._env_prefix for c in classes]
    assert all(prefixes) and len(set(prefixes)) == len(prefixes), prefixes
    for block in classes:
        aliases = getattr(block, "_env_aliases", {})
        assert set(aliases.values()) <= set(block.model_fields), block
        assert not {f"{block._env_prefix}{f}".upper() for f in block.model_fields} & set(aliases), block


def test_the_shared_cpu_slot_settings_carry_the_house_prefix(monkeypatch, tmp_path):
    monkeypatch.setenv("CPU_HEAVY_SLOTS", "997")
    monkeypatch.setenv("PIPELINES_CPU_HEAVY_SLOTS", "2")
    assert limits.cpu_heavy_slots() == 2
    monkeypatch.delenv("PIPELINES_CPU_HEAVY_SLOTS")
    assert limits.cpu_heavy_slots() != 997  # the bare name is another tool's
    monkeypatch.setenv("CPU_SLOTS_DIR", str(tmp_path / "bare"))
    monkeypatch.setenv("PIPELINES_CPU_SLOTS_DIR", str(tmp_path / "slots"))
    assert limits.cpu_slots_dir() == tmp_path / "slots"


def test_aws_containers_and_flow_runs_get_the_catalog_database_under_the_etl_prefix():
    from deployments.aws import flow_run_environment
    from infra import cloudformation as cfn

    containers = {variable["Name"]: variable["Value"] for variable in cfn.environment(False)}
    assert containers["ETL_CATALOG_DATABASE"] == {"Ref": "CatalogDatabase"} and "CATALOG_DATABASE" not in containers
    outputs = {"BucketUrl": "s3://bucket/prefix"}
    assert flow_run_environment("dev", outputs, {})["ETL_CATALOG_DATABASE"] == "ndjson_parquet"  # the default
    flow_runs = flow_run_environment("dev", outputs, {"CatalogDatabase": "mine"})
    assert flow_runs["ETL_CATALOG_DATABASE"] == "mine" and "CATALOG_DATABASE" not in flow_runs
