"""An error names the part of the request at fault, in a bounded message.

* a memory 404 named its field in ``param`` only, not in the message as every other route;
* an error quoted the client's names in full: an unknown or repeated 1-MB key (body or query) was
  echoed in the message and the param, as was a long unknown path; now clipped;
* ``OPTIONS`` and ``TRACE`` of a known path were Starlette's bare "Method Not Allowed" (no
  ``param``, an ``Allow`` of one route's methods), unlike ``PUT`` and ``PATCH``;
* Starlette's own 404 and 405 (a path no route matches, ``/console/a%2Fb``; a method a console
  route does not take), the ``/v1`` catch-all's 404 and the console's missing file came back as
  "Not Found" / "Method Not Allowed" / "unknown route ..." with ``param: null``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import assert_envelope, headers


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_a_memory_404_names_its_field_in_the_message(rig: Rig, method: str) -> None:
    error = assert_envelope(rig.client.request(method, "/v1/memories/" + "0" * 32, headers=headers(A)), 404, "memory_id")
    assert error["message"].startswith("memory_id: "), error


CHAT: dict[str, Any] = {"model": "recallserve", "metadata": {"agent": "off"},
                        "messages": [{"role": "user", "content": "hi"}]}


# ---- an error quotes the client's names clipped -----------------------------------------------------

LONG = "k" * 200_000
ECHOES = {
    "unknown body key": ("POST", "/v1/chat/completions", json.dumps({**CHAT, LONG: 1})),
    "unknown nested key": ("POST", "/v1/memories", json.dumps({"memories": [{"text": "x", LONG: 1}]})),
    "duplicate key": ("POST", "/v1/memories/search", '{"query": "x", "%s": 1, "%s": 2}' % (LONG, LONG)),
    "unknown query parameter": ("GET", f"/v1/turns?{'q' * 20_000}=1", None),
    "repeated query parameter": ("GET", f"/v1/turns?{'q' * 20_000}=1&{'q' * 20_000}=2", None),
    "unknown route": ("GET", f"/v1/{'r' * 20_000}", None),
    "method not allowed": ("PUT", f"/v1/memories/{'m' * 20_000}", None),
}


@pytest.mark.parametrize("case", ECHOES)
def test_an_error_quotes_a_long_client_name_clipped(rig: Rig, case: str) -> None:
    method, url, body = ECHOES[case]
    r = rig.client.request(method, url, content=body, headers=headers(A, **{"content-type": "application/json"}))
    assert 400 <= r.status_code < 500, r.text[:300]
    error = r.json()["error"]
    assert len(r.content) < 2_000 and len(error["param"] or "") <= 400, (len(r.content), error["message"][:300])
    assert "more characters)" in error["message"], error["message"][:300]


# ---- every method of a known path is answered as PUT and PATCH are -----------------------------------

@pytest.mark.parametrize("method", ["OPTIONS", "TRACE"])
@pytest.mark.parametrize(("url", "allowed"), [("/v1/models", "GET"), ("/v1/memories/m1", "DELETE, GET"),
                                              ("/v1/chat/completions", "POST")])
def test_another_method_of_a_known_path_is_405_naming_it(rig: Rig, method: str, url: str, allowed: str) -> None:
    r = rig.client.request(method, url, headers=headers(A))
    assert r.status_code == 405 and r.headers.get("allow") == allowed, (r.status_code, r.headers)
    error = assert_envelope(r, 405, "method")
    assert error["message"].startswith(f"method: {method} is not allowed"), error


def _json(rig: Rig, method: str, url: str, body: Any = None, tenant: str = A, **kw: Any) -> Any:
    return rig.client.request(method, url, json=body, headers=headers(tenant), **kw)


# ---- every 4xx names what it is about ------------------------------------------------------------------

@pytest.mark.parametrize(("method", "url", "status", "param"), [
    ("GET", "/console/..%2f..%2fetc%2fpasswd", 404, "path"),
    ("GET", "/console/no-such-file.js", 404, "name"),
    ("POST", "/console/index.html", 405, "method"),
    ("GET", "/v1/memories/a/b", 404, "path"),
    ("GET", "/v1/no-such-route", 404, "path"),
])
def test_a_404_or_405_names_the_part_of_the_request_at_fault(rig: Rig, method: str, url: str, status: int,
                                                             param: str) -> None:
    r = _json(rig, method, url)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(f"{param}: "), err
    assert err["message"] not in ("Not Found", "Method Not Allowed"), err
