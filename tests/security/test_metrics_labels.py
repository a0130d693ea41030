"""The ``/metrics`` series a client can make: a made-up HTTP method must not mint a new series
(label cardinality), on a known path, an unknown path or the public health check.
"""

from __future__ import annotations

import uuid

import pytest

from recallserve.serve.api.metrics import render_metrics
from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import headers


@pytest.mark.parametrize("path", ["/healthz", "/v1/no-such-route", "/v1/memories"])
def test_a_made_up_method_adds_no_metric_series(shared_rig: Rig, path: str) -> None:
    method = f"PROBE{uuid.uuid4().hex[:12].upper()}"
    r = shared_rig.client.request(method, path, headers=headers(A))
    assert 400 <= r.status_code < 500, r.text
    text = render_metrics().decode()
    assert method not in text
    assert 'method="OTHER"' in text
