"""Infrastructure as code: infra/cloudformation.py generates infra/pipelines.template.json."""
