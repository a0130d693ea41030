"""A chat turn's image that cannot be read is the client's error: a 400 naming the part
(``messages.<m>.content.<p>.image_url.url``), before any model call, session write or stream
event, on every path (plain, streaming, agent). It was dropped in silence on the plain and
streaming paths: the answer came back 200 as if no image had been sent.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from recallserve.serve.agent.demo.scenario import demo_photo_data_url
from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import assert_envelope, headers

BAD = {
    "remote URL": "https://example.com/receipt.png",
    "not an image type": "data:text/plain;base64," + base64.b64encode(b"hello").decode(),
    "not base64": "data:image/png;base64,@@@not-base64@@@",
    "not base64 at all": "data:image/png,rawbytes",
    "bytes that are no image": "data:image/png;base64," + base64.b64encode(b"not an image at all").decode(),
}


def _body(url: str, **extra: object) -> dict:
    return {"model": "recallserve", "user": "u1", "metadata": {"session_id": "s-img", "agent": "off"},
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "what does this photo show?"},
                                                      {"type": "image_url", "image_url": {"url": demo_photo_data_url()}},
                                                      {"type": "image_url", "image_url": {"url": url}}]}]} | extra


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("agent", ["off", "on"])
@pytest.mark.parametrize("kind", BAD)
def test_an_unreadable_image_is_400_naming_its_part(rig: Rig, kind: str, stream: bool, agent: str) -> None:
    body = _body(BAD[kind], stream=stream)
    body["metadata"]["agent"] = agent
    r = rig.client.post("/v1/chat/completions", json=body, headers=headers(A))
    error = assert_envelope(r, 400, "messages.1.content.2.image_url.url")
    assert error["code"] == "invalid_image" and "messages.1.content.2.image_url.url" in error["message"], error
    assert rig.engine.calls == []  # no model call
    session = rig.client.get("/v1/sessions/s-img", params={"user": "u1"}, headers=headers(A))
    assert session.status_code == 404, session.text  # nothing opened or written


def test_a_readable_image_is_answered(rig: Rig) -> None:
    """The positive control: the same turn with the one good image."""
    body = _body(demo_photo_data_url())
    r = rig.client.post("/v1/chat/completions", json=body, headers=headers(A))
    assert r.status_code == 200, r.text
    assert "image" in rig.prompts()[-1]


ASK = {"role": "user", "content": "Weather in Paris?"}


def _chat(rig: Rig, messages: list[dict[str, Any]] | None = None, *, stream: bool = False, **extra: Any) -> Any:
    body = {"model": "recallserve", "metadata": {"agent": "off"}, "messages": messages or [ASK], "stream": stream}
    return rig.client.post("/v1/chat/completions", json={**body, **extra}, headers=headers(A))


def test_an_empty_question_is_not_said_to_hold_an_image(rig: Rig) -> None:
    assert _chat(rig, [{"role": "user", "content": ""}]).status_code == 200
    prompt = rig.prompts()[-1]
    assert "image" not in prompt and "Question: (an empty message)" in prompt, prompt
