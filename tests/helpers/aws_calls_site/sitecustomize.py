"""Loaded by every Python process whose PYTHONPATH starts here (tests/helpers/aws_calls.py): records its AWS calls."""

import os

if os.environ.get("PIPELINES_AWS_CALL_LOG"):
    from tests.helpers.aws_calls import install

    install()
