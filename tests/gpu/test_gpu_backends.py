"""Seed 002: the ECS backend against moto's ECS (API shapes only) and the health checks' verdicts."""

from __future__ import annotations

import pytest

from blocks.gpu import GpuCompute
from tasks.gpu import health as gpu_health
from tasks.gpu.backends import GPU_CLUSTER_TAG, BackendError, EcsBackend, TaskSpec


def test_nvml_without_a_gpu_says_no_gpu_not_healthy():
    result = gpu_health.nvml_check(xid_wait_ms=10)
    if result.readings.get("device_count"):
        pytest.skip("a GPU is present: see test_nvml_on_a_gpu")
    assert result.status == "unknown" and result.reason.startswith("no GPU: NVMLError_")
    assert not result.healthy and result.method == "nvml"


def test_nvml_on_a_gpu():
    result = gpu_health.nvml_check(xid_wait_ms=100)
    if not result.readings.get("device_count"):
        pytest.skip(f"no GPU here: {result.reason}")
    assert result.status in ("healthy", "unhealthy")
    assert {"ecc_uncorrected_volatile", "remapped_rows", "temperature_c"} <= set(result.readings["devices"][0])


def test_nvml_verdicts_from_readings():
    good = {
        "index": 0,
        "ecc_uncorrected_volatile": 0,
        "remapped_rows": {"pending": 0, "failed": 0},
        "temperature_c": 40,
        "temperature_slowdown_c": 87,
    }
    assert gpu_health.judge_nvml({"device_count": 1, "devices": [good], "xid_critical_events": {}}) == (
        "healthy",
        "1 GPU(s) passed ECC, row-remapping, XID and temperature checks",
    )
    bad = dict(good, index=1, ecc_uncorrected_volatile=2, remapped_rows={"pending": 1, "failed": 1}, temperature_c=90)
    status, reason = gpu_health.judge_nvml(
        {"device_count": 2, "devices": [good, bad], "xid_critical_events": {1: [79, 13], 0: [13]}}
    )
    assert status == "unhealthy" and reason == (
        "GPU 1: 2 uncorrected ECC errors since boot; GPU 1: row remapping pending (reset needed); "
        "GPU 1: row remapping failed; GPU 1: temperature 90 C at or above slowdown 87 C; GPU 1: critical XID [79]"
    )
    unsupported = dict(good, ecc_uncorrected_volatile="n/a: Not Supported", remapped_rows="n/a: Not Supported")
    assert (
        gpu_health.judge_nvml({"device_count": 1, "devices": [unsupported], "xid_critical_events": "n/a"})[0]
        == "healthy"
    )
    assert gpu_health.judge_nvml({"device_count": 0, "devices": []}) == ("unknown", "no GPU: NVML found 0 devices")


def test_command_and_dcgmi_checks():
    assert gpu_health.command_check("true").status == "healthy"
    failed = gpu_health.command_check(["sh", "-c", "echo xid 79; exit 3"])
    assert (failed.status, failed.reason, failed.readings["stdout"]) == (
        "unhealthy",
        "health command exited 3",
        "xid 79\n",
    )
    assert gpu_health.command_check("sleep 5", timeout_s=0.2).reason == "health command timed out"
    assert gpu_health.command_check("/no/such/check").status == "unknown"
    dcgm = gpu_health.dcgmi_check()
    if dcgm.reason.startswith("no DCGM"):
        assert dcgm.status == "unknown"
    with pytest.raises(ValueError, match="unknown health check"):
        gpu_health.run_check("magic")


def test_ecs_backend_api_shapes_against_moto(monkeypatch):
    moto = pytest.importorskip("moto")
    import boto3
    from moto.ec2 import utils as ec2_utils

    with moto.mock_aws():
        session = boto3.Session(region_name="us-east-1")
        ecs, ec2 = session.client("ecs"), session.client("ec2")
        ecs.create_cluster(clusterName="gpu")
        for family in ("train", "dcgm"):
            ecs.register_task_definition(
                family=family,
                containerDefinitions=[{"name": "main", "image": "nvcr.io/nvidia/pytorch", "memory": 128, "cpu": 1}],
            )
        image = ec2.describe_images()["Images"][0]["ImageId"]
        tags = [{"ResourceType": "instance", "Tags": [{"Key": GPU_CLUSTER_TAG, "Value": "gpu"}]}]  # docs/aws.md
        instance = boto3.resource("ec2", region_name="us-east-1").create_instances(
            ImageId=image, MinCount=1, MaxCount=1, TagSpecifications=tags
        )[0]
        document = ec2_utils.generate_instance_identity_document(instance)
        import json

        ecs.register_container_instance(cluster="gpu", instanceIdentityDocument=json.dumps(document))
        config = GpuCompute(
            backend="ecs",
            cluster_name="gpu",
            task_definition="train",
            health_task_definition="dcgm",
            health_timeout_s=0.3,
            poll_interval_s=0.1,
            region_name="us-east-1",
        )
        backend = EcsBackend(config, session=session)

        nodes = backend.discover_nodes()
        assert [n["node_name"] for n in nodes] == [instance.id]
        node = nodes[0]
        assert node["container_instance_arn"].startswith("arn:aws:ecs:us-east-1:")
        started = backend.start_task(TaskSpec("job-1", 0, node, 0, 1, "python train.py --epochs 1"))
        assert started.task_def_name == "train" and started.task_def_revision == "1"
        described = ecs.describe_tasks(cluster="gpu", tasks=[started.task_id])["tasks"][0]
        override = described["overrides"]["containerOverrides"][0]
        assert override["command"] == ["python", "train.py", "--epochs", "1"]
        assert {"name": "NODE_NAME", "value": instance.id} in override["environment"]
        assert described["containerInstanceArn"] == node["container_instance_arn"]
        assert backend.poll(started.task_id) is None  # RUNNING
        # a start resumed after a crash (the task row was never written) finds the task, starts no second one
        again = backend.start_task(TaskSpec("job-1", 0, node, 0, 1, "python train.py --epochs 1"))
        assert again.task_id == started.task_id and len(ecs.list_tasks(cluster="gpu")["taskArns"]) == 1
        backend.stop(started.task_id, "stopped: another task of the job failed")
        stopped = backend.poll(started.task_id)
        assert stopped is not None and stopped.reason
        health = backend.health_check(node)  # moto moves the DCGM task to STOPPED with exit code 0
        assert health.method == "dcgmi" and health.status == (
            "healthy" if health.readings["exit_code"] == 0 else "unhealthy"
        )
        dcgm = ecs.describe_tasks(cluster="gpu", tasks=[health.readings["task_id"]])["tasks"][0]
        assert dcgm["taskDefinitionArn"].endswith("task-definition/dcgm:1")
        assert dcgm["overrides"]["containerOverrides"][0]["command"] == ["dcgmi", "diag", "-r", "1"]
        assert backend.node_ready(node) is True
        backend.reboot(node)
        with pytest.raises(BackendError, match="ECS describe_tasks failed"):
            EcsBackend(config.model_copy(update={"cluster_name": "nope"}), session=session).poll("abc")
