"""Prompt tokens of a typical session turn on the default (agent) path: the first reasoner call.

Runs the real pipeline (context-mode session, agent with the demo tools, no router) in process; a
recording engine stands in for the model and keeps the prompts, which are counted with the offline
cl100k tokenizer. Usage (from a checkout; PYTHONPATH picks that checkout's code)::

    PYTHONPATH=. python scripts/prompt_tokens.py ["last question"]

Prints one JSON line: messages and tokens of the prompt, and whether the client's system prompt,
the turn-1 constraint, the order id and the date reached it.
"""
import json
import sys
import tempfile
from pathlib import Path
from fastapi.testclient import TestClient
from recallserve.serve.agent import Agent, AgentConfig, default_registry
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.context import ContextManager, SessionStore
from recallserve.serve.engine import ChatResult, ChatDelta
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings

from recallserve.serve.tokens import get_tokenizer
enc = get_tokenizer()

class Rec:
    model_name = "rec"; context_window = 4096
    def __init__(self): self.calls = []
    async def chat(self, messages, params):
        self.calls.append(list(messages))
        if params.json_schema is not None and "tools" in params.json_schema.get("properties", {}):
            return ChatResult(text='{"tools": []}', prompt_tokens=1, completion_tokens=1, finish_reason="stop", model="rec")
        t = '{"thought":"ok","type":"final","answer":"Noted."}' if params.json_schema else "Noted."
        return ChatResult(text=t, prompt_tokens=1, completion_tokens=1, finish_reason="stop", model="rec")
    async def stream(self, messages, params):
        r = await self.chat(messages, params)
        yield ChatDelta(text=r.text); yield ChatDelta(text="", finish_reason="stop", prompt_tokens=1, completion_tokens=1)
    async def count_tokens(self, text): return len(enc.encode(text))
    async def close(self): pass

eng = Rec()
d = tempfile.mkdtemp()
ctx = ContextManager(SessionStore(Path(d) / "s.sqlite3"))
agent = Agent(eng, default_registry(demo=True), config=AgentConfig(use_router=False))
pipe = ChatPipeline(eng, PipelineSettings(), context=ctx, agent=agent)
turns = ["Hi, my order 104208 arrived with a cracked water tank. Please never call me before 10am.",
         "I bought it on 3 May 2024 for 249 EUR.", "Which spare part do I need?", "How long does shipping take?",
         "Can I get a refund instead?", sys.argv[1] if len(sys.argv) > 1 else "Thanks. And what was my order number again?"]
with TestClient(create_app(pipe, Authenticator({"sk": "t"}))) as c:
    for t in turns:
        eng.calls.clear()
        r = c.post("/v1/chat/completions", headers={"Authorization": "Bearer sk"}, json={
            "model": "recallserve", "user": "u", "max_tokens": 64, "metadata": {"session_id": "s1"},
            "messages": [{"role": "system", "content": "You are Acme's assistant."}, {"role": "user", "content": t}]})
        assert r.status_code == 200, r.text
    p = eng.calls[0]
    toks = sum(len(enc.encode(m.content)) + 4 for m in p)
    text = "\n".join(m.content for m in p)
    print(json.dumps({"messages": len(p), "prompt_tokens": toks, "has_client_system": "Acme's assistant" in text,
                      "has_constraint": "never call me before 10am" in text, "has_order": "104208" in text,
                      "has_date": "3 May 2024" in text}))
