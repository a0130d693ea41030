"""Probe: the cost of decomposing one LoCoMo question with the cpu-local router model (llama.cpp, CPU).

Not part of the serving path. cpu-local's router shares the reasoner's llama.cpp process
(qwen2.5-coder-1.5b-instruct-q4_k_m, 2 threads); a decomposition would be one chat call per
search, before retrieval. This times that call alone (load excluded) for the first N multi-hop
questions of the dev file and prints the sub-questions, so its cost can be set against the memory
tier's search budget. Results: loadtests/results/locomo-dev-hop-loo.md.

Usage (from the repo root)::

    python -m loadtests.locomo_decompose_cost LOCOMO_FILE [N]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from recallserve.memory_shards.retrieval.locomo import load_locomo

MODEL = Path("~/.cache/recallserve/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf").expanduser()
PROMPT = ("Split the question into at most 3 short search queries, one per line, each about one thing to look up "
          "in a chat history. Write only the queries.\nQuestion: {q}")


def main(path: str, n: int) -> dict:
    from llama_cpp import Llama

    questions = [q.question for c in load_locomo(path) for q in c.questions if q.category == 1][:n]
    t0 = time.perf_counter()
    llm = Llama(model_path=str(MODEL), n_ctx=1024, n_threads=2, verbose=False)
    load_s = time.perf_counter() - t0
    rows = []
    for q in questions:
        t0 = time.perf_counter()
        out = llm.create_chat_completion([{"role": "user", "content": PROMPT.format(q=q)}], max_tokens=64, temperature=0.0)
        rows.append({"question": q, "seconds": round(time.perf_counter() - t0, 2),
                     "prompt_tokens": out["usage"]["prompt_tokens"], "completion_tokens": out["usage"]["completion_tokens"],
                     "queries": out["choices"][0]["message"]["content"].strip().splitlines()})
    secs = sorted(r["seconds"] for r in rows)
    return {"model": MODEL.name, "threads": 2, "load_s": round(load_s, 1), "questions": len(rows),
            "p50_s": secs[len(secs) // 2], "max_s": secs[-1], "rows": rows}


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(f"usage: python -m loadtests.locomo_decompose_cost LOCOMO_FILE [N]\n{__doc__}")
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 5), indent=1))
