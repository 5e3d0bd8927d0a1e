"""The version of this code: what ``pipelines --version``, the image's label, the health artifact and the data
folder's stamp say. pyproject.toml and the Dockerfile's label carry the same string
(tests/core/test_releases.py checks); releases.json names the commit of each release before this one."""

from __future__ import annotations

VERSION = "0.3.0"
