"""Minimal safetensors writer and memory-mapping reader.

The file layout is the public safetensors format: 8 bytes little-endian header length,
a JSON header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``
padded with spaces to a multiple of 8, then the raw little-endian tensor bytes. Files this
module writes load with ``safetensors.numpy.load_file``; we write and read it ourselves so
that writing is one sequential pass with no copies, and reading is a zero-copy ``np.memmap``.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterator, Mapping

import numpy as np

from .errors import DamagedFileError
from .format import atomic_write

_TO_ST = {
    "float16": "F16", "float32": "F32", "float64": "F64",
    "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
    "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
}
_FROM_ST = {v: np.dtype(k) for k, v in _TO_ST.items()}
MAX_HEADER = 100 * 1024 * 1024


def header_for(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """The padded header (length prefix included) for ``arrays`` laid out in order."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, arr in arrays.items():
        dtype = _TO_ST.get(arr.dtype.name)
        if dtype is None:
            raise TypeError(f"tensor {name!r} has dtype {arr.dtype}, which safetensors cannot hold; "
                            f"use one of {sorted(_TO_ST)}")
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _chunks(header: bytes, arrays: Mapping[str, np.ndarray]) -> Iterator[bytes | memoryview]:
    yield header
    for arr in arrays.values():
        if arr.nbytes:
            yield memoryview(np.ascontiguousarray(arr)).cast("B")


class Encoded:
    """Arrays ready to write: little-endian, with their header. ``size`` is the file's exact
    size, known before writing (the writer's byte budget checks it when a dump is queued)."""

    def __init__(self, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
        self.arrays = {k: (v.astype(v.dtype.newbyteorder("<")) if v.dtype.byteorder == ">" else v)
                       for k, v in arrays.items()}
        self.header = header_for(self.arrays, metadata)
        self.size = len(self.header) + sum(a.nbytes for a in self.arrays.values())

    def write(self, path: Path, fsync: bool = True) -> int:
        """Atomically write to ``path`` (fsync: see ``format.atomic_write``); returns the file size."""
        return atomic_write(Path(path), _chunks(self.header, self.arrays), fsync=fsync, size=self.size)


def write(path: Path, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None,
          fsync: bool = True) -> int:
    """Atomically write ``arrays`` to ``path`` (fsync: see ``format.atomic_write``); returns the file size."""
    return Encoded(arrays, metadata).write(path, fsync)


def read_header(path: Path) -> tuple[dict, int]:
    """Parse and validate the header of ``path``. Returns (header, data_start)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise ValueError("shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", prefix)
            if n > min(MAX_HEADER, size - 8):
                raise ValueError(f"header length {n} exceeds the file size {size}")
            header = json.loads(f.read(n))
        data_start = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            if info["dtype"] not in _FROM_ST:
                raise ValueError(f"tensor {name!r} has unsupported dtype {info['dtype']}")
            expected = int(np.prod(info["shape"], dtype=np.int64)) * _FROM_ST[info["dtype"]].itemsize
            if end - begin != expected or data_start + end > size:
                raise ValueError(f"tensor {name!r} extends past the end of the file (truncated?)")
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise DamagedFileError(f"damaged dump file {path}: {e}") from None
    return header, data_start


def load(path: Path, name: str, header: dict, data_start: int) -> np.ndarray:
    """Memory-map tensor ``name`` of ``path`` (read-only, zero-copy)."""
    info = header[name]
    begin, end = info["data_offsets"]
    dtype = _FROM_ST[info["dtype"]]
    shape = tuple(info["shape"])
    if end == begin:
        return np.zeros(shape, dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=data_start + begin, shape=shape)
