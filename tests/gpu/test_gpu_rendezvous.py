"""Seed 002, issue 24 item 1: the tasks of a multi-node job find each other. Every task gets the job's
rendezvous (MASTER_ADDR/PORT of node 0, WORLD_SIZE, RANK, the peers' addresses, the InfiniBand device), built
from the job's current nodes at each (re)start; a real two-process handshake on the local backend, before and
after a restart on a spare node; ECS nodes' private IPs and the UNKNOWN status of a node that cannot be described."""

from __future__ import annotations

import json
import sys

import pytest

from flows.gpu import PLAIN, watch
from tasks.gpu import jobs as gpu
from tasks.gpu.backends import BackendError
from tests.helpers.crashpoints import REPO_ROOT
from tests.helpers.gpu import statuses

pytestmark = pytest.mark.servers  # runs flows on the Prefect server, records in DynamoDB Local

HANDSHAKE = f"{sys.executable} {REPO_ROOT / 'tests' / 'rendezvous_handshake.py'}"
NODES = ["local-0", "local-1", "local-2"]


def seen(gpu_env, task_id: str) -> dict:
    """What the task's handshake printed (its log's last line)."""
    log = gpu_env.backend.state_dir / "logs" / f"{task_id}.log"
    return json.loads(log.read_text().splitlines()[-1])


def test_rendezvous_env_names_node_0_the_peers_and_the_ib_device():
    nodes = [
        {"node_name": "i-a", "ip": "10.0.0.5", "ibdev": "mlx5_0"},
        {"node_name": "i-b", "ip": "10.0.0.9", "ibdev": "mlx5_1"},
    ]
    assert gpu.rendezvous_env(nodes, 1, 29501) == {
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29501",
        "WORLD_SIZE": "2",
        "RANK": "1",
        "NODE_RANK": "1",
        "PIPELINES_PEERS": "10.0.0.5,10.0.0.9",
        "NCCL_IB_HCA": "mlx5_1",
    }
    nodes[0]["ibdev"] = "none"
    assert gpu.rendezvous_env(nodes, 0, "29500")["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in gpu.rendezvous_env(nodes, 0, "29500")
    # a node without an address cannot join a multi-node job; a one-node job needs none
    with pytest.raises(BackendError, match=r"node\(s\) \['i-b'\] have no address"):
        gpu.rendezvous_env([nodes[0], {"node_name": "i-b", "ip": ""}], 0, 29500)
    assert gpu.rendezvous_env([{"node_name": "i-c", "ip": ""}], 0, 1)["WORLD_SIZE"] == "1"


def test_two_nodes_rendezvous_and_handshake(gpu_env):
    job = gpu.launch_job(gpu_env, "job-rdv", 2, HANDSHAKE)
    port = job["master_port"]
    assert job["master_port_retry"] == "0" and int(port) > 0
    assert watch(gpu_env, "job-rdv", PLAIN, timeout_s=30)["job_status"] == "COMPLETE"
    assert statuses("task", ["job-rdv-r0-n0", "job-rdv-r0-n1"]) == {
        "job-rdv-r0-n0": "COMPLETE",
        "job-rdv-r0-n1": "COMPLETE",
    }
    common = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": port,
        "WORLD_SIZE": "2",
        "PIPELINES_PEERS": "127.0.0.1,127.0.0.2",
        "retry": "0",
    }
    assert seen(gpu_env, "job-rdv-r0-n0") == {
        "rank": 0,
        "saw_rank": "1",
        "peer_address": "127.0.0.2",
        "NODE_RANK": "0",
        **common,
    }
    assert seen(gpu_env, "job-rdv-r0-n1") == {
        "rank": 1,
        "saw_rank": "0",
        "peer_address": "127.0.0.1",
        "NODE_RANK": "1",
        **common,
    }
    assert statuses("node", NODES) == dict.fromkeys(NODES, "AVAILABLE")


def test_the_gpu_job_flow_runs_the_handshake_and_a_resumed_start_keeps_the_port(gpu_env):
    from flows.gpu import gpu_job

    summary = gpu_job(command=HANDSHAKE, num_nodes=2, job_id="job-rdv-flow")
    assert (summary["job_status"], summary["assigned_nodes"]) == ("COMPLETE", ["local-0", "local-1"])
    assert seen(gpu_env, "job-rdv-flow-r0-n1")["saw_rank"] == "0"
    # a start resumed by another runner (the first died before recording its tasks) reuses the attempt's port
    job = gpu.launch_job(gpu_env, "job-rdv-resume", 2, HANDSHAKE)
    assert gpu.with_master_port(gpu.make_runner(), "job-rdv-resume", "IN_PROGRESS")["master_port"] == job["master_port"]
    assert watch(gpu_env, "job-rdv-resume", PLAIN, timeout_s=30)["job_status"] == "COMPLETE"


def test_a_restart_on_a_spare_node_rendezvous_at_the_new_address(gpu_env):
    gpu_env.backend.inject_health_command("local-0", "false")  # node 0's task fails and its node is unhealthy
    job = gpu.launch_job(gpu_env, "job-rdv2", 2, HANDSHAKE, env={"HANDSHAKE_FAIL": "0:0"})
    first_port = job["master_port"]
    job = watch(gpu_env, "job-rdv2", PLAIN, timeout_s=30)
    assert (job["job_status"], job["retry"], job["assigned_nodes"]) == ("COMPLETE", "1", ["local-2", "local-1"])
    assert job["master_port_retry"] == "1"
    assert gpu.get_task("job-rdv2-r0-n0")["exit_code"] == "1"
    assert gpu.get_task("job-rdv2-r0-n1")["task_status"] == "TERMINATED"  # stopped while it waited for rank 0
    common = {
        "MASTER_ADDR": "127.0.0.3",
        "MASTER_PORT": job["master_port"],
        "WORLD_SIZE": "2",
        "PIPELINES_PEERS": "127.0.0.3,127.0.0.2",
        "retry": "1",
    }
    assert seen(gpu_env, "job-rdv2-r1-n0") == {
        "rank": 0,
        "saw_rank": "1",
        "peer_address": "127.0.0.2",
        "NODE_RANK": "0",
        **common,
    }
    assert seen(gpu_env, "job-rdv2-r1-n1") == {
        "rank": 1,
        "saw_rank": "0",
        "peer_address": "127.0.0.3",
        "NODE_RANK": "1",
        **common,
    }
    print(f"\nretry 0 port {first_port}, retry 1 port {job['master_port']} on {job['assigned_nodes']}")
    assert gpu.get_node("local-0")["node_status"] in ("REBOOTING", "AVAILABLE")


def test_ecs_nodes_rendezvous_at_their_private_ips_and_an_undescribable_node_is_unknown(tables, monkeypatch):
    """moto stands in for ECS and EC2; the records are DynamoDB Local's (moto passes its endpoint through)."""
    moto = pytest.importorskip("moto")
    import boto3
    from moto.ec2 import utils as ec2_utils

    from blocks.gpu import GpuCompute
    from tasks.gpu.backends import EcsBackend

    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_ECS", "AWS_ENDPOINT_URL_EC2"):
        monkeypatch.delenv(name, raising=False)
    with moto.mock_aws():
        session = boto3.Session(region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
        ecs, ec2 = session.client("ecs"), session.client("ec2")
        ecs.create_cluster(clusterName="gpu")
        ecs.register_task_definition(
            family="train",
            containerDefinitions=[{"name": "main", "image": "nvcr.io/nvidia/pytorch", "memory": 128, "cpu": 1}],
        )
        image = ec2.describe_images()["Images"][0]["ImageId"]
        instances = session.resource("ec2").create_instances(ImageId=image, MinCount=4, MaxCount=4)
        for instance in instances:
            ecs.register_container_instance(
                cluster="gpu",
                instanceIdentityDocument=json.dumps(ec2_utils.generate_instance_identity_document(instance)),
            )
        ghost = instances.pop()
        ghost.terminate()  # ECS still lists its container instance; EC2 no longer describes it
        config = GpuCompute(
            backend="ecs", cluster_name="gpu", task_definition="train", region_name="us-east-1", poll_interval_s=0.1
        )
        runner = gpu.Runner(EcsBackend(config, session=session), config)
        a, b, c = sorted(instances, key=lambda i: i.id)
        ips = {i.id: i.private_ip_address for i in instances}

        assert gpu.register_nodes(runner.backend, "gpu") == {
            a.id: "registered",
            b.id: "registered",
            c.id: "registered",
            ghost.id: f"registered UNKNOWN: EC2 cannot describe instance {ghost.id}",
        }
        assert {n: gpu.get_node(n)["ip"] for n in ips} == ips and all(ips.values())
        assert gpu.get_node(ghost.id)["node_status"] == "UNKNOWN"
        # an idle node whose instance is gone -> UNKNOWN; one described again -> AVAILABLE with its address
        c.terminate()
        gpu.move_node(a.id, None, "AVAILABLE", "UNKNOWN", ip="")
        outcome = gpu.register_nodes(runner.backend, "gpu")
        assert (outcome[a.id], outcome[b.id], outcome[c.id]) == (
            "described again: AVAILABLE",
            "exists (AVAILABLE)",
            f"UNKNOWN: EC2 cannot describe instance {c.id}",
        )
        assert statuses("node", [a.id, b.id, c.id]) == {a.id: "AVAILABLE", b.id: "AVAILABLE", c.id: "UNKNOWN"}
        assert gpu.get_node(a.id)["ip"] == ips[a.id]
        with pytest.raises(gpu.NotEnoughNodes, match="needs 3 nodes, 2 AVAILABLE"):  # no job takes an UNKNOWN node
            gpu.assign_nodes("job-three", 3, "gpu")

        job = gpu.launch_job(runner, "job-ecs", 2, "python train.py", env={"EPOCHS": "1"})
        assert job["assigned_nodes"] == [a.id, b.id] and job["master_port"] == "29500"
        for index, task_id in enumerate(job["submitted_ecs_task_ids"]):
            task = ecs.describe_tasks(cluster="gpu", tasks=[task_id])["tasks"][0]
            env = {e["name"]: e["value"] for e in task["overrides"]["containerOverrides"][0]["environment"]}
            assert {
                k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "PIPELINES_PEERS", "EPOCHS")
            } == {
                "MASTER_ADDR": ips[a.id],
                "MASTER_PORT": "29500",
                "WORLD_SIZE": "2",
                "RANK": str(index),
                "PIPELINES_PEERS": f"{ips[a.id]},{ips[b.id]}",
                "EPOCHS": "1",
            }
            assert env["NCCL_IB_DISABLE"] == "1"  # no ibdev attribute on these instances
