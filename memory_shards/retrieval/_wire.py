"""The compact wire form of a shard's hybrid answer, and the light hits it unpacks to.

A shard answers a hybrid query with up to ``dense_k + lexical_k`` hits (128 by default), each
carrying its whole record, while the retriever keeps only the fused top-k (16 by default). Sent
as pydantic models, that answer cost the shard 2.7 ms of CPU to cloudpickle and the ingress 1.7 ms
to rebuild, per search (2,000 rows, 109 distinct records; ``recallserve bench search-cost``): more
than the BM25 half of the search itself. So the answer travels as plain tuples:

* each distinct record once, as the tuple of its field values (``MemoryRecord.model_fields`` order;
  parts as plain dicts), pickled by the C pickler into one ``bytes`` object, so Ray's cloudpickle
  sees a single blob;
* each hit as ``(record index, score, similarity, time factor, part index, shard)``.

On the receiving side each hit is a :class:`WireHit`: it has the attributes the fusion reads
(``score``, ``similarity``, ``time_factor``, ``part_index``, ``shard``, ``source_id``, ``id``) as plain
slots and ``metadata`` from the tuple, and builds its :class:`~recallserve.memory_shards.records.MemoryRecord` (validated, as any record) only
when ``record`` is read, which the retriever does for the hits it returns. In process (no Ray),
hits stay the shard's own ``SearchHit`` objects: nothing is packed.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

from ..config import SearchHit
from ..records import MemoryRecord

__all__ = ["WireHit", "pack_hits", "unpack_hits"]

_FIELDS: tuple[str, ...] = tuple(MemoryRecord.model_fields)
_PARTS = _FIELDS.index("parts")
_METADATA = _FIELDS.index("metadata")


class WireHit:
    """A shard hit read from the wire; its record is built on first use.

    Duck-types the parts of :class:`~recallserve.memory_shards.config.SearchHit` the retriever reads.
    """

    __slots__ = ("_values", "_record", "id", "source_id", "score", "similarity", "time_factor", "part_index", "shard")

    def __init__(self, values: tuple[Any, ...], score: float, similarity: float, time_factor: float,
                 part_index: int, shard: int) -> None:
        self._values = values
        self._record: MemoryRecord | None = None
        self.id: str = values[0]
        self.source_id: str = values[2]
        self.score = score
        self.similarity = similarity
        self.time_factor = time_factor
        self.part_index = part_index
        self.shard = shard

    @property
    def metadata(self) -> dict[str, Any]:
        """The record's metadata, read without building the record (the named-speaker lists read it for every candidate)."""
        return self._values[_METADATA]

    @property
    def record(self) -> MemoryRecord:
        """The whole record (validated once, on first read)."""
        if self._record is None:
            self._record = MemoryRecord.model_validate(dict(zip(_FIELDS, self._values, strict=True)))
        return self._record


def _record_values(record: MemoryRecord) -> tuple[Any, ...]:
    values = [getattr(record, f) for f in _FIELDS]
    values[_PARTS] = [p.model_dump() for p in record.parts]
    return tuple(values)


def pack_hits(dense: Sequence[SearchHit | WireHit], lexical: Sequence[tuple[SearchHit | WireHit, float]]) -> bytes:
    """``dense`` hits and ``(hit, bm25)`` lexical pairs -> one pickled blob (each record once)."""
    records: list[tuple[Any, ...]] = []
    index: dict[str, int] = {}

    def at(hit: SearchHit | WireHit) -> int:
        i = index.get(hit.id)
        if i is None:
            i = index[hit.id] = len(records)
            records.append(_record_values(hit.record))
        return i

    d = [(at(h), h.score, h.similarity, h.time_factor, h.part_index, h.shard) for h in dense]
    lx = [(at(h), h.score, h.similarity, h.time_factor, h.part_index, h.shard, bm25) for h, bm25 in lexical]
    return pickle.dumps((_FIELDS, records, d, lx), protocol=pickle.HIGHEST_PROTOCOL)


def unpack_hits(blob: bytes) -> tuple[list[WireHit], list[tuple[WireHit, float]]]:
    """Inverse of :func:`pack_hits`: ``(dense, lexical)`` as :class:`WireHit` s.

    Raises:
        ValueError: the blob was packed with other record fields (a shard and an ingress of
            different versions during a rolling update); the shard call then fails as a call.
    """
    fields, records, d, lx = pickle.loads(blob)  # noqa: S301 - written by our own shard replica
    if tuple(fields) != _FIELDS:
        raise ValueError(f"shard answer: record fields {fields} differ from this version's {_FIELDS}")
    dense = [WireHit(records[i], *rest) for i, *rest in d]
    lexical = [(WireHit(records[i], *rest[:-1]), rest[-1]) for i, *rest in lx]
    return dense, lexical
