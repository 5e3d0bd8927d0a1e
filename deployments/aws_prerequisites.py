"""What `pipelines aws-stack deploy` needs before it changes anything, each checked and named when missing.

A newcomer's setup fails late and far from its cause otherwise: a subnet without a way out fails the worker's image
pull minutes after the stack is made, a second env in one Prefect workspace overwrites the first's pool. So the
deploy (its dry run too) reads these first and refuses with every problem at once, each with what to do:

- the network: the VPC, its subnets (each with a default route to a NAT, or the VPC endpoints ECS needs), security
  groups in the VPC that let 443 out;
- a Docker daemon answering (the image is built here);
- the Prefect API URL answering, and its workspace not holding another env's ECS pool (one env per workspace: the
  pool, the ``default`` blocks and the ``*/ecs`` deployments carry one env's cluster, roles and tables).
"""

from __future__ import annotations

from typing import Any

# what an ECS task in a subnet with no route out reaches through VPC endpoints: the image (ECR's API and registry,
# its layers in S3), the logs, the secrets
ENDPOINT_SERVICES = ("ecr.api", "ecr.dkr", "s3", "logs", "secretsmanager")
ANYWHERE = "0.0.0.0/0"
ROUTES_OUT = ("NatGatewayId", "TransitGatewayId", "NetworkInterfaceId", "InstanceId")  # a NAT, or a NAT instance


def route_table(ec2: Any, vpc: str, subnet: str) -> dict[str, Any] | None:
    """The subnet's route table: its own association, else the VPC's main table (as EC2 routes it)."""
    for filters in (
        [{"Name": "association.subnet-id", "Values": [subnet]}],
        [{"Name": "vpc-id", "Values": [vpc]}, {"Name": "association.main", "Values": ["true"]}],
    ):
        tables = ec2.describe_route_tables(Filters=filters)["RouteTables"]
        if tables:
            return tables[0]
    return None


def default_route(table: dict[str, Any] | None) -> dict[str, Any] | None:
    """The table's active 0.0.0.0/0 route, or None."""
    routes = (table or {}).get("Routes", [])
    active = (r for r in routes if r.get("DestinationCidrBlock") == ANYWHERE and r.get("State") != "blackhole")
    return next(active, None)


def missing_endpoints(ec2: Any, vpc: str, region: str) -> list[str]:
    """The services of ``ENDPOINT_SERVICES`` with no VPC endpoint in ``vpc``."""
    endpoints = ec2.describe_vpc_endpoints(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["VpcEndpoints"]
    present = {e["ServiceName"] for e in endpoints if e.get("State", "available").lower() != "deleted"}
    return [s for s in ENDPOINT_SERVICES if f"com.amazonaws.{region}.{s}" not in present]


def subnet_problems(ec2: Any, vpc: str, subnets: list[str], region: str, public_ip: bool) -> list[str]:
    """Each subnet missing, outside ``vpc``, or with no way to ECR, logs and Secrets Manager (a default route to a
    NAT; to an internet gateway only with a public IP; else the VPC endpoints)."""
    described = ec2.describe_subnets(Filters=[{"Name": "subnet-id", "Values": subnets}])["Subnets"]
    found = {s["SubnetId"]: s for s in described}
    problems, endpoints = [], None
    for subnet in subnets:
        if subnet not in found:
            problems.append(f"subnet {subnet} does not exist in this account and region")
            continue
        if found[subnet]["VpcId"] != vpc:
            problems.append(f"subnet {subnet} is in {found[subnet]['VpcId']}, not in --vpc {vpc}")
            continue
        route = default_route(route_table(ec2, vpc, subnet))
        if route and any(route.get(k) for k in ROUTES_OUT):
            continue
        if route and str(route.get("GatewayId", "")).startswith("igw-") and public_ip:
            continue
        endpoints = missing_endpoints(ec2, vpc, region) if endpoints is None else endpoints
        if not endpoints:
            continue
        why = (
            "routes 0.0.0.0/0 to an internet gateway, which a task without a public IP cannot use"
            if route and str(route.get("GatewayId", "")).startswith("igw-")
            else "has no 0.0.0.0/0 route"
        )
        problems.append(
            f"subnet {subnet}'s route table {why}: add a route to a NAT gateway (aws ec2 create-route "
            f"--destination-cidr-block {ANYWHERE} --nat-gateway-id NAT --route-table-id TABLE), or VPC endpoints "
            f"in {vpc} for {', '.join(endpoints)} (missing), or --assign-public-ip ENABLED in a public subnet"
        )
    return problems


def lets_443_out(group: dict[str, Any]) -> bool:
    """Whether the group has an egress rule for TCP 443 to anywhere."""
    for rule in group.get("IpPermissionsEgress", []):
        covers = rule.get("IpProtocol") == "-1" or (
            rule.get("IpProtocol") == "tcp" and rule.get("FromPort", 0) <= 443 <= rule.get("ToPort", 65535)
        )
        if covers and any(r.get("CidrIp") == ANYWHERE for r in rule.get("IpRanges", [])):
            return True
    return False


def group_problems(ec2: Any, vpc: str, groups: list[str]) -> list[str]:
    """Each security group missing, outside ``vpc``, or with no outbound 443 (ECR, Prefect, AWS's APIs)."""
    found = {
        g["GroupId"]: g
        for g in ec2.describe_security_groups(Filters=[{"Name": "group-id", "Values": groups}])["SecurityGroups"]
    }
    problems = []
    for group in groups:
        if group not in found:
            problems.append(f"security group {group} does not exist in this account and region")
        elif found[group]["VpcId"] != vpc:
            problems.append(f"security group {group} is in {found[group]['VpcId']}, not in --vpc {vpc}")
        elif not lets_443_out(found[group]):
            problems.append(
                f"security group {group} lets no TCP 443 out to {ANYWHERE} (ECR, Prefect and AWS's APIs): "
                f"aws ec2 authorize-security-group-egress --group-id {group} --protocol tcp --port 443 "
                f"--cidr {ANYWHERE}"
            )
    return problems


def network_problems(
    ec2: Any, vpc: str, subnets: list[str], groups: list[str], region: str, public_ip: bool = False
) -> list[str]:
    """What in the network would keep the stack's tasks from their image, logs, secrets and Prefect."""
    if not ec2.describe_vpcs(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["Vpcs"]:
        return [f"VPC {vpc} does not exist in this account and region ({region}): aws ec2 describe-vpcs"]
    return subnet_problems(ec2, vpc, subnets, region, public_ip) + group_problems(ec2, vpc, groups)


def docker_problem() -> str | None:
    """Why no Docker daemon answers (None: one does); the deploy builds the image here."""
    import os

    import docker

    try:
        docker.from_env(timeout=5).version()
    except Exception as error:  # noqa: BLE001 (any failure to reach the daemon is the same missing prerequisite)
        where = os.environ.get("DOCKER_HOST", "the default socket")
        return f"no Docker daemon answers at {where} ({type(error).__name__}): start Docker; `docker info` checks it"
    return None


def ecs_pool_owner(client: Any) -> str | None:
    """The env whose stack set the workspace's ECS pool's defaults (its TABLE_ENV), or None (no pool, or bare)."""
    from prefect.exceptions import ObjectNotFound

    from deployments.local_stack import ECS_WORK_POOL

    try:
        pool = client.read_work_pool(ECS_WORK_POOL)
    except ObjectNotFound:
        return None
    variables = (pool.base_job_template or {}).get("variables", {}).get("properties", {})
    return ((variables.get("env") or {}).get("default") or {}).get("TABLE_ENV")


def prefect_problems(env: str, api_url: str) -> list[str]:
    """The Prefect API URL missing or not answering, or its workspace held by another env."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from deployments.local_stack import ECS_WORK_POOL

    if not api_url:
        return ["no Prefect API URL: give --prefect-api-url or set PREFECT_API_URL (`prefect config view` shows it)"]
    with temporary_settings({PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        if (failure := client.api_healthcheck()) is not None:
            return [f"the Prefect API at {api_url} does not answer ({type(failure).__name__}): check the URL and key"]
        owner = ecs_pool_owner(client)
    if owner and owner != env:
        return [
            f"the Prefect workspace at {api_url} holds env {owner}'s {ECS_WORK_POOL} pool, default blocks and ecs "
            f"deployments (one env per workspace: {env} would overwrite them): deploy {env} with another "
            f"workspace's --prefect-api-url, or run `pipelines aws-stack destroy --env {owner}` first"
        ]
    return []


def refuse_unless_ready(
    session: Any,
    region: str,
    env: str,
    vpc: str,
    subnets: list[str],
    groups: list[str],
    api_url: str,
    public_ip: bool = False,
) -> None:
    """A ValueError naming every missing prerequisite, each with what to do; nothing is changed before it."""
    problems = network_problems(session.client("ec2", region_name=region), vpc, subnets, groups, region, public_ip)
    problems += [p for p in (docker_problem(),) if p]
    problems += prefect_problems(env, api_url)
    if problems:
        raise ValueError(
            f"{len(problems)} prerequisite(s) of the deploy are missing (nothing was changed; docs/aws.md "
            "'Before the one command' checks each): " + "; ".join(problems)
        )
