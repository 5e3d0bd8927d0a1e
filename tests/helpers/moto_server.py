"""moto's server as a fixture: a thread of the test's process on a free loopback port, every AWS client but
DynamoDB's sent to it (``AWS_ENDPOINT_URL``). moto's change sets do not refresh a stack's outputs
(``Stack.output_map``): done here from the change set's template, as its `update_stack` does."""

from __future__ import annotations

import pytest


@pytest.fixture
def moto_thread(monkeypatch):
    """moto's server on a free loopback port in this process; every AWS client but DynamoDB's goes to it."""
    from moto.cloudformation.models import ChangeSet
    from moto.cloudformation.parsing import OutputMap
    from moto.server import ThreadedMotoServer

    from deployments.dynamodb_local import free_port

    apply = ChangeSet.apply

    def apply_and_refresh_outputs(self) -> None:
        """moto's apply, then the stack's outputs recomputed as moto's own update does."""
        apply(self)
        self.stack.output_map = OutputMap(self.stack.resource_map, self.template_dict, self.stack.stack_id)

    monkeypatch.setattr(ChangeSet, "apply", apply_and_refresh_outputs)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
