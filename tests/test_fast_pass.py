"""The fast pass (``-m "not slow"``) refuses what would load a model, start Ray or the browser.

See :data:`tests.conftest.HEAVY_CALLS`: in the fast pass each installed entry point fails the test
that calls it; in a full run they are the real ones.
"""

from __future__ import annotations

import importlib

import pytest

from tests.conftest import HEAVY_CALLS, SLOW_FIXTURES, SLOW_MARKERS, _is_fast_pass


@pytest.mark.parametrize(("module_name", "attr", "what"), HEAVY_CALLS, ids=[f"{m}.{a}" for m, a, _ in HEAVY_CALLS])
def test_the_fast_pass_refuses_each_heavy_call(request: pytest.FixtureRequest, module_name: str, attr: str,
                                               what: str) -> None:
    if not _is_fast_pass(request.config):
        pytest.skip("the guard is on only under -m 'not slow'")
    module = pytest.importorskip(module_name)
    with pytest.raises(pytest.fail.Exception, match=f"this test {what} .*mark it slow"):
        getattr(module, attr)()


def test_a_full_run_keeps_the_real_entry_points(request: pytest.FixtureRequest) -> None:
    if _is_fast_pass(request.config):
        pytest.skip("the guard is on under -m 'not slow'")
    llama_cpp = pytest.importorskip("llama_cpp")
    assert isinstance(llama_cpp.Llama, type)  # the class, not the fast pass's refusal


@pytest.mark.parametrize("expr", ["not slow", "not slow and not gpu", "kernels and  not   slow"])
def test_a_marker_expression_deselecting_slow_is_the_fast_pass(pytestconfig: pytest.Config, expr: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pytestconfig.option, "markexpr", expr)
    assert _is_fast_pass(pytestconfig)
    monkeypatch.setattr(pytestconfig.option, "markexpr", "slow")
    assert not _is_fast_pass(pytestconfig)


def test_the_integration_and_browser_tests_are_slow(pytestconfig: pytest.Config) -> None:
    # NOTE: the hook's keys must still name something: the markers are registered and each slow
    # fixture is still defined where its key says (a renamed fixture would drop its tests' mark).
    registered = " ".join(pytestconfig.getini("markers"))
    assert all(f"{m}:" in registered for m in SLOW_MARKERS), registered
    for key in SLOW_FIXTURES:
        where, name = key.split("::")
        module = where.replace("/", ".").removesuffix(".py") + ("" if where.endswith(".py") else ".conftest")
        assert hasattr(importlib.import_module(module), name), key
