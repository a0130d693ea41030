"""WAL: replay in order, a torn tail is dropped and truncated, mid-log corruption raises."""

from __future__ import annotations

from pathlib import Path

import pytest

from recallserve.memory_shards._wal import WalCorruptError, WriteAheadLog


def _entries(a: int, b: int) -> list[dict]:
    return [{"seq": s, "op": "x", "v": "é" * s} for s in range(a, b)]


def test_append_and_replay(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.ensure_open(1)
    wal.append(_entries(1, 4))
    wal.append(_entries(4, 6))
    wal.close()
    assert [e["seq"] for e in WriteAheadLog(tmp_path).replay(after_seq=0)] == [1, 2, 3, 4, 5]
    assert [e["seq"] for e in WriteAheadLog(tmp_path).replay(after_seq=3)] == [4, 5]


@pytest.mark.parametrize("tail", [b"0000abcd {\"seq\": 9", b"deadbeef {\"seq\":6}\n", b"\n", b"zz"])
def test_torn_tail_is_ignored_and_truncated(tmp_path: Path, tail: bytes) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.ensure_open(1)
    wal.append(_entries(1, 3))
    wal.close()
    seg = wal.segments()[-1]
    good = seg.stat().st_size
    with seg.open("ab") as fh:
        fh.write(tail)
    assert [e["seq"] for e in WriteAheadLog(tmp_path).replay(0)] == [1, 2]
    assert seg.stat().st_size == good
    wal2 = WriteAheadLog(tmp_path)
    wal2.ensure_open(3)
    wal2.append(_entries(3, 4))
    wal2.close()
    assert [e["seq"] for e in WriteAheadLog(tmp_path).replay(0)] == [1, 2, 3]


def test_corruption_before_good_entries_raises(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.ensure_open(1)
    wal.append(_entries(1, 4))
    wal.close()
    seg = wal.segments()[-1]
    data = bytearray(seg.read_bytes())
    data[12] ^= 0x01  # flip a bit inside the first entry's JSON
    seg.write_bytes(bytes(data))
    with pytest.raises(WalCorruptError, match="corrupt line"):
        list(WriteAheadLog(tmp_path).replay(0))


def test_segments_rotate_and_old_ones_drop(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    wal.open_segment(1)
    wal.append(_entries(1, 5))
    wal.open_segment(5)
    wal.append(_entries(5, 7))
    assert len(wal.segments()) == 2
    wal.drop_through(4)
    assert len(wal.segments()) == 1
    assert [e["seq"] for e in WriteAheadLog(tmp_path).replay(4)] == [5, 6]
    wal.close()
