"""Offline tiktoken setup (serve.tokens)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import tiktoken

from recallserve.serve import tokens
from recallserve.serve.tokens import (
    CachedCounter,
    EngineTokenCounter,
    TiktokenCounter,
    count_tokens,
    get_tokenizer,
)

from .conftest import StubEngine, run


def test_count_tokens_known_values() -> None:
    # NOTE: reference ids of cl100k_base (OpenAI cookbook): "hello world" -> [15339, 1917].
    assert get_tokenizer().encode("hello world") == [15339, 1917]
    assert count_tokens("hello world") == 2
    assert count_tokens("") == 0
    # special-token text is counted as ordinary text, not refused
    assert count_tokens("<|endoftext|>") > 1


def test_cached_file_is_official_and_get_encoding_works_offline() -> None:
    get_tokenizer()
    folder = Path(tokens._cache_dir())
    cached = folder / hashlib.sha1(tokens._OFFICIAL_URL.encode()).hexdigest()
    assert cached.is_file()
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == tokens._OFFICIAL_SHA256
    # tiktoken's own loader (with its hash check) now finds it without a download
    assert tiktoken.get_encoding("cl100k_base").encode("offline") == get_tokenizer().encode("offline")


def test_install_into_fresh_cache_dir(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    target = tokens._install_cached_file()
    assert target.parent == tmp_path
    assert hashlib.sha256(target.read_bytes()).hexdigest() == tokens._OFFICIAL_SHA256
    # a corrupt cached file is replaced, not trusted
    target.write_bytes(b"garbage")
    tokens._install_cached_file()
    assert hashlib.sha256(target.read_bytes()).hexdigest() == tokens._OFFICIAL_SHA256


def test_counters() -> None:
    assert run(TiktokenCounter().count("hello world")) == 2
    engine_counter = EngineTokenCounter(StubEngine([]))
    assert engine_counter.name == "engine:stub-model"
    assert run(engine_counter.count("one two three")) == 3
    cached = CachedCounter(TiktokenCounter(), capacity=2)
    assert cached.name == TiktokenCounter.name
    assert [run(cached.count(t)) for t in ("a b", "c", "d e f", "a b")] == [2, 1, 3, 2]
