"""Read back what an offline W&B run wrote: its `run-<id>.wandb` file, the
record log `wandb sync` uploads. W&B's Python package no longer ships a
reader for it (its service, in Go, writes and reads it), so this is the
format as W&B writes it: a 7-byte header (`:W&B`, a magic number, a
version), then LevelDB's log format (32 KiB blocks of records, each with a
checksum, a length and whether it is whole, first, middle or last of a
record cut across blocks), each record a `wandb_internal_pb2.Record`
protobuf, parsed with W&B's own message class."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    pos, parts = HEADER, []
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a record header: padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            parts = [chunk]
        elif kind == MIDDLE:
            parts.append(chunk)
        elif kind == LAST:
            yield b"".join([*parts, chunk])


def _items(items: Any) -> dict[str, Any]:
    return {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items}


def read_run(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """An offline run folder's history rows (each with its `_step`) and its
    summary as the run ends with it (every summary update applied)."""
    from wandb.proto import wandb_internal_pb2 as pb

    [path] = run_dir.glob("run-*.wandb")
    history: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    for data in records(path):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append(_items(record.history.item))
        elif kind == "summary":
            summary.update(_items(record.summary.update))
    return history, summary
