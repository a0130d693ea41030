"""Chat model files: the built-in registry, joining wheel parts, sha256 verification, specs.

Example:
    >>> from recallserve.deployments.models import ModelSpec, resolve_model_path
    >>> path = resolve_model_path(ModelSpec.model_validate("smollm2-135m-instruct-q4_1"))  # doctest: +SKIP
"""

from recallserve.deployments.models._files import ModelError, ModelIntegrityError, ModelNotInstalledError
from recallserve.deployments.models._registry import BUILTIN_MODELS, DEFAULT_MODEL, LIGHT_MODEL, TINY_MODEL, BuiltinModel
from recallserve.deployments.models._spec import (
    ModelSpec,
    ModelStatus,
    builtin_status,
    cached_path,
    default_spec,
    ensure_builtin,
    get_builtin,
    resolve_model_path,
)

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "LIGHT_MODEL",
    "TINY_MODEL",
    "BuiltinModel",
    "ModelError",
    "ModelIntegrityError",
    "ModelNotInstalledError",
    "ModelSpec",
    "ModelStatus",
    "builtin_status",
    "cached_path",
    "default_spec",
    "ensure_builtin",
    "get_builtin",
    "resolve_model_path",
]
