"""Segmented (E-CoT) reasoning through the chat endpoint, and the experience API mounted beside it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from recallserve.deployments.engines import LlamaCppConfig, LlamaCppEngine
from recallserve.memory_shards import HashingEmbedder
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.experience import ExperienceConfig, ExperienceService, build_router
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings

KEYS = {"sk-acme": "acme", "sk-globex": "globex"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    emb = HashingEmbedder(384)
    experiences = ExperienceService(ExperienceConfig(data_dir=tmp_path / "exp", max_tokens=96), emb.embed)
    engine = LlamaCppEngine(LlamaCppConfig(model="smollm2-135m-instruct-q4_1", n_ctx=2048, n_threads=1))
    pipeline = ChatPipeline(engine, PipelineSettings(), experiences=experiences)
    auth = Authenticator(KEYS)
    with TestClient(create_app(pipeline, auth, routers=[build_router(experiences, auth)])) as c:
        yield c
    experiences.close()


def test_segmented_chat_answers_and_reports_the_trace(client: TestClient) -> None:
    # NOTE: the tiny model rarely writes a parsable four-segment trace; then the raw reply is the
    # answer and the reply is stored unparsed in the review queue. Storage with the default model is checked in
    # tests/integration/test_cluster_cpu_local.py.
    r = client.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-acme"},
                    json={"model": "recallserve", "max_tokens": 96,
                          "metadata": {"reasoning": "segmented", "task_domain": "arithmetic"},
                          "messages": [{"role": "user", "content": "What is 17 * 3?"}]})
    assert r.status_code == 200, r.text
    meta = r.json()["recallserve"]["experience"]
    assert set(meta) >= {"id", "confidence", "injected", "required_checks", "parsed"}
    # An unparsable reply is kept for review (tagged unparsed), never reused.
    assert meta["parsed"] or meta["id"] is None or meta["tier"] == "review"
    assert r.json()["choices"][0]["message"]["content"].strip()
    review = client.get("/v1/experiences/review", headers={"Authorization": "Bearer sk-acme"})
    assert review.status_code == 200
