"""The cpu-local cluster end to end: Ray Serve on 127.0.0.1, the default real model, the OpenAI SDK."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from deployments import runner
from deployments.config import AppConfig, load_config

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(work_dir: Path, port: int) -> Iterator[AppConfig]:
    config = load_config(
        "cpu-local",
        overrides={
            "server": {"port": port},
            "ray": {"temp_dir": str(work_dir / "ray"), "num_cpus": 8, "num_gpus": 0},
            "memory": {"data_dir": str(work_dir / "memory")},
        },
    )
    runner.prepare_models(config, progress=False)
    start = time.perf_counter()
    runner.start_ray(config)
    try:
        runner.deploy(config, timeout_s=600)
        print(f"\ncpu-local cluster up in {time.perf_counter() - start:.1f} s")
        yield config
    finally:
        runner.shutdown()


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
        model="recallserve", messages=[{"role": "user", "content": "Count from 1 to 5."}], max_tokens=24, stream=True,
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert len(pieces) > 1
    assert "".join(pieces).strip()


def test_bad_key_and_bad_body_through_the_proxy(cluster: AppConfig) -> None:
    import httpx

    url = f"http://127.0.0.1:{cluster.server.port}/v1/chat/completions"
    r = httpx.post(url, json={"model": "recallserve", "messages": []}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    r = httpx.post(url, json={"model": "recallserve", "messages": []}, headers={"Authorization": "Bearer sk-local"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    health = httpx.get(f"http://127.0.0.1:{cluster.server.port}/healthz").json()
    assert health["profile"] == "cpu-local"
