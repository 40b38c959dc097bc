"""Minimal safetensors writer and defensive reader.

The file layout is the public safetensors format: 8 bytes little-endian header length,
a JSON header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``
padded with spaces to a multiple of 8, then the raw little-endian tensor bytes. Files this
module writes load with ``safetensors.numpy.load_file``; we write and read it ourselves so
that writing is one sequential pass with no copies.

Reading is defensive (issue 11): :func:`read_header` applies every check of the safetensors
library (``Metadata::validate``) and more (types, duplicate keys, nesting depth, a header
cap checked before reading, aliases, checksums); :func:`load` copies arrays up to READ_MAX
bytes into memory (a file truncated meanwhile gives DamagedFileError, not SIGBUS) and
memory-maps larger ones; it verifies each array's CRC32 once when asked (``verified``).
"""
from __future__ import annotations

import functools
import json
import math
import os
import struct
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import numpy as np

from inspector.errors import DamagedFileError, StorageError
from inspector.format import ALIASES_KEY
from inspector.storage.atomic import atomic_write
from inspector.storage.safety import open_regular

if TYPE_CHECKING:
    from inspector.storage import Ranged

_TO_ST = {
    "float16": "F16", "float32": "F32", "float64": "F64",
    "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64",
    "uint8": "U8", "uint16": "U16", "uint32": "U32", "uint64": "U64", "bool": "BOOL",
}
_FROM_ST = {v: np.dtype(k) for k, v in _TO_ST.items()}
#: Longest JSON header accepted (the safetensors library allows 100 MB). A full dump of 327
#: arrays under ResNet-50 tensor names has a 60 KB header (41 KB without the checksums); the
#: cap is checked, with the file size, before the header is read.
MAX_HEADER = 16 * 1024 * 1024
#: Most dimensions of an array (numpy's limit).
MAX_NDIM = 32
#: ``__metadata__`` keys the writer adds: ``crc32``, a JSON object {stored key: CRC32 of the
#: array's bytes}; ``header_crc32``, the CRC32 (decimal string) of the header's canonical
#: JSON (see :func:`header_crc`), so a flipped dtype, shape or offset is caught too.
CRC_KEY = "crc32"
HEADER_CRC_KEY = "header_crc32"
#: Arrays up to this many bytes are read into memory (a copy); larger ones are memory-mapped.
READ_MAX = 64 * 1024 * 1024
_CRC_MAX = 0xFFFFFFFF
#: The ``__metadata__`` keys this project writes. An unknown key of the same length as one of
#: them, differing in at most 2 characters, is taken for a damaged one (a flipped byte in
#: ``header_crc32`` would otherwise turn the checksum off).
KNOWN_METADATA = ("step", "worker", "format_version", ALIASES_KEY, CRC_KEY, HEADER_CRC_KEY)


def _entries(arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None) -> dict:
    """The header as a dict, arrays laid out in order."""
    header: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, arr in arrays.items():
        dtype = _TO_ST.get(arr.dtype.name)
        if dtype is None:
            raise TypeError(f"tensor {name!r} has dtype {arr.dtype}, which safetensors cannot "
                            f"hold; use one of {sorted(_TO_ST)}")
        header[name] = {"dtype": dtype, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    return header


def _pack(header: dict, length: int | None = None) -> bytes:
    """Length prefix + JSON of ``header``, padded with spaces to a multiple of
    8 (or to ``length``)."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((-len(raw) % 8) if length is None else length - len(raw))
    return struct.pack("<Q", len(raw)) + raw


def header_for(arrays: Mapping[str, np.ndarray],
               metadata: Mapping[str, str] | None = None) -> bytes:
    """The padded header (length prefix included) for ``arrays`` laid out in order."""
    return _pack(_entries(arrays, metadata))


def header_crc(header: dict) -> int:
    """CRC32 of the canonical JSON of ``header`` (sorted keys, no spaces,
    ``header_crc32`` left out)."""
    meta = {k: v for k, v in header.get("__metadata__", {}).items() if k != HEADER_CRC_KEY}
    canonical = {**header, "__metadata__": meta}
    return zlib.crc32(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode())


def _bytes(arr: np.ndarray) -> memoryview:
    return memoryview(np.ascontiguousarray(arr)).cast("B")


def _chunks(header: bytes, arrays: Mapping[str, np.ndarray]) -> Iterator[bytes | memoryview]:
    yield header
    for arr in arrays.values():
        if arr.nbytes:
            yield _bytes(arr)


class Encoded:
    """Arrays ready to write: little-endian, with their header. ``size`` is the file's exact
    size, known before writing (the writer's byte budget checks it when a dump is queued).

    ``checksums``: the header holds CRC32s of every array and of itself (CRC_KEY,
    HEADER_CRC_KEY). They are computed by :meth:`write` (the writer's dump thread, not the
    training loop); the header reserves room for the widest values,
    so ``size`` is exact beforehand."""

    def __init__(self, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None,
                 checksums: bool = True) -> None:
        self.arrays = {k: (v.astype(v.dtype.newbyteorder("<")) if v.dtype.byteorder == ">" else v)
                       for k, v in arrays.items()}
        self.checksums = checksums
        meta = dict(metadata or {})
        if checksums:  # the widest values: the real header is padded to this length
            meta.update({CRC_KEY: json.dumps(dict.fromkeys(self.arrays, _CRC_MAX),
                                             separators=(",", ":")),
                         HEADER_CRC_KEY: str(_CRC_MAX)})
        self._meta = meta
        self.header = header_for(self.arrays, meta)
        self.size = len(self.header) + sum(a.nbytes for a in self.arrays.values())

    def final_header(self) -> bytes:
        """The header to write: ``self.header`` with the checksums filled in, same length."""
        if not self.checksums:
            return self.header
        crcs = {k: zlib.crc32(_bytes(a)) if a.nbytes else 0 for k, a in self.arrays.items()}
        header = _entries(self.arrays,
                          {**self._meta, CRC_KEY: json.dumps(crcs, separators=(",", ":"))})
        header["__metadata__"][HEADER_CRC_KEY] = str(header_crc(header))
        return _pack(header, len(self.header) - 8)

    def chunks(self) -> Iterator[bytes | memoryview]:
        """The file's bytes in order (header with checksums, then each array):
        what a storage writes."""
        return _chunks(self.final_header(), self.arrays)

    def write(self, path: Path, fsync: bool = True) -> int:
        """Atomically write to ``path`` (fsync: see ``storage.atomic.atomic_write``);
        returns the file size."""
        return atomic_write(Path(path), self.chunks(), fsync=fsync, size=self.size)


def write(path: Path, arrays: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None,
          fsync: bool = True) -> int:
    """Atomically write ``arrays`` to ``path`` (fsync: see ``storage.atomic.atomic_write``);
    returns the file size."""
    return Encoded(arrays, metadata).write(path, fsync)


# ---- reading ------------------------------------------------------------------------------
def read_header(path: Path, root: Path | None = None) -> tuple[dict, int]:
    """Parse and validate the header of ``path`` (a regular file, inside ``root`` when given).
    Returns (header, data_start); DamagedFileError naming the file if anything is wrong."""
    from inspector.storage._local import _LocalRanged
    path = Path(path)
    try:
        with _LocalRanged(path, root) as r:
            return header_of(r)
    except OSError as e:
        raise DamagedFileError(f"damaged dump file {path}: {e}") from None


#: The first read of a header takes this many bytes: the length prefix and, for every dump
#: but the largest catalogs, the whole header in one request (one range request remotely).
HEADER_PROBE = 64 * 1024


def header_of(r: "Ranged") -> tuple[dict, int]:
    """(header, data_start) of the dump file open as ``r`` (``storage.Ranged``): the 8-byte
    length and the JSON header, read as one range when it fits HEADER_PROBE, then checked
    (see :func:`read_header`)."""
    try:
        probe = r.pread(0, min(r.size, HEADER_PROBE))
        n = _header_length(probe[:8], r.size)
        raw = probe[8:8 + n]
        if len(raw) < n and len(probe) == min(r.size, HEADER_PROBE):
            raw += r.pread(len(probe), 8 + n - len(probe))
        if len(raw) != n:
            raise ValueError("the file shrank while its header was read")
        header = parse_header(raw)
        check_header(header, r.size - 8 - n)
    except StorageError:
        raise   # the store did not answer: not a damaged file
    except (OSError, ValueError, KeyError, TypeError, struct.error) as e:
        raise DamagedFileError(f"damaged dump file {r.name}: {e}") from None
    return header, 8 + n


def _header_length(prefix: bytes, size: int) -> int:
    """N from the 8-byte prefix, checked against MAX_HEADER and the file size before reading."""
    if len(prefix) < 8:
        raise ValueError(f"{size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", prefix)
    if n > MAX_HEADER:
        raise ValueError(f"header length {n:,} exceeds the cap of {MAX_HEADER:,} bytes")
    if n > size - 8:
        raise ValueError(f"header length {n:,} exceeds the file size {size:,} (truncated?)")
    return n


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        dup = next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i]))
        raise ValueError(f"the header names {dup!r} twice")
    return out


def _no_constant(name: str) -> None:
    raise ValueError(f"the header holds {name}, which JSON does not allow")


def _json(text: str | bytes) -> Any:
    """Strict JSON: no duplicate keys, no NaN/Infinity; too deep nesting is a ValueError."""
    try:
        return json.loads(text, object_pairs_hook=_object_pairs, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def parse_header(raw: bytes) -> dict:
    """The header JSON object from its bytes (strict UTF-8 and JSON, see :func:`_json`)."""
    text = raw.decode("utf-8")
    if not text.startswith("{"):
        raise ValueError("the header is not a JSON object")
    header = _json(text)
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    return header


def _int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer, not {value!r}"[:200])
    return value


def _check_entry(name: str, info: Any) -> tuple[int, int]:
    """(begin, end) of a tensor entry whose dtype, shape and offsets agree."""
    if not isinstance(info, dict):
        raise ValueError(f"tensor {name!r} is not an object")
    dtype = info.get("dtype")
    if not isinstance(dtype, str) or dtype not in _FROM_ST:
        raise ValueError(f"tensor {name!r} has unsupported dtype {dtype!r}"[:200])
    shape = info.get("shape")
    if not isinstance(shape, list) or len(shape) > MAX_NDIM:
        raise ValueError(f"tensor {name!r} has no valid shape (a list of at most {MAX_NDIM} "
                         "integers)")
    dims = [_int(d, f"a dimension of tensor {name!r}") for d in shape]
    offsets = info.get("data_offsets")
    if not isinstance(offsets, list) or len(offsets) != 2:
        raise ValueError(f"tensor {name!r} has no valid data_offsets (a list [begin, end])")
    begin, end = (_int(o, f"an offset of tensor {name!r}") for o in offsets)
    itemsize = _FROM_ST[dtype].itemsize
    if math.prod(max(d, 1) for d in dims) * itemsize >= 2 ** 63:
        raise ValueError(f"tensor {name!r} has a shape too large for any array: {dims}"[:200])
    if begin > end or end - begin != math.prod(dims) * itemsize:
        raise ValueError(f"tensor {name!r}: data_offsets {begin}..{end} do not hold {dtype} {dims}"
                         [:200])
    return begin, end


def check_header(header: dict, data_len: int) -> None:
    """ValueError unless ``header`` is a valid safetensors header for ``data_len`` bytes of
    data: the library's checks (dtype, offsets sorted, contiguous from 0, sizes agreeing with
    shapes, the last end at the end of the file) plus metadata, alias and checksum checks."""
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("__metadata__ is not an object of strings")
    _check_metadata_keys(meta)
    spans = sorted((_check_entry(k, v), k) for k, v in header.items() if k != "__metadata__")
    pos = 0
    for (begin, end), name in spans:
        if begin != pos:
            raise ValueError(f"tensor {name!r} starts at {begin}, not at {pos} "
                             f"({'gap' if begin > pos else 'overlap'})")
        pos = end
    if pos != data_len:
        raise ValueError(f"the arrays end at byte {pos:,} of the data but the file holds "
                         f"{data_len:,} (truncated or extended?)")
    aliases(header)
    crcs(header)
    if HEADER_CRC_KEY in meta and meta[HEADER_CRC_KEY] != str(header_crc(header)):
        raise ValueError(f"the header does not match its checksum {HEADER_CRC_KEY} (corrupted)")


def _check_metadata_keys(meta: dict) -> None:
    """ValueError if a metadata key looks like a damaged known one, or only one of the two
    checksum keys is there (the writer writes both)."""
    for key in meta:
        for known in KNOWN_METADATA:
            if key != known and len(key) == len(known) \
                    and sum(a != b for a, b in zip(key, known)) <= 2:
                raise ValueError(f"metadata key {key!r} looks like a damaged {known!r}")
    if (CRC_KEY in meta) != (HEADER_CRC_KEY in meta):
        raise ValueError(f"the metadata holds only one of {CRC_KEY!r} and {HEADER_CRC_KEY!r}")


def _stored(header: dict) -> set[str]:
    return {k for k in header if k != "__metadata__"}


def _string_map(header: dict, key: str) -> dict | None:
    """The JSON object stored as metadata ``key`` (None if absent); ValueError unless an object."""
    raw = header.get("__metadata__", {}).get(key)
    if raw is None:
        return None
    value = _parsed(raw)
    if not isinstance(value, dict):
        raise ValueError(f"its {key!r} metadata is not a JSON object")
    return value


@functools.lru_cache(maxsize=64)
def _parsed(raw: str) -> Any:
    return _json(raw)


def aliases(header: dict) -> dict[str, str]:
    """{alias key: stored key} (metadata ALIASES_KEY); ValueError unless every alias is a new
    key (it shadows no stored key) naming a stored key (not another alias: no chains, no loops)."""
    found = _string_map(header, ALIASES_KEY) or {}
    stored = _stored(header)
    for alias, target in found.items():
        if not isinstance(target, str) or target not in stored or alias in stored \
                or alias == "__metadata__":
            raise ValueError(f"its {ALIASES_KEY!r} metadata does not name arrays of the file "
                             f"({_trim(alias)} -> {_trim(target)})")
    return dict(found)


def _trim(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def crcs(header: dict) -> dict[str, int]:
    """{stored key: CRC32 of its bytes} (metadata CRC_KEY), {} for files without it."""
    found = _string_map(header, CRC_KEY) or {}
    stored = _stored(header)
    for key, crc in found.items():
        if key not in stored or not isinstance(crc, int) or isinstance(crc, bool) \
                or not 0 <= crc <= _CRC_MAX:
            raise ValueError(f"its {CRC_KEY!r} metadata does not hold a CRC32 per array "
                             f"({_trim(key)})")
    return found


def load(path: Path, name: str, header: dict, data_start: int, *, root: Path | None = None,
         verified: set | None = None) -> np.ndarray:
    """Tensor ``name`` of ``path``: read into memory up to READ_MAX bytes, else memory-mapped
    (read-only). ``verified``: a set of (path, name) already checked; when given, the array's
    CRC32 (if the file has one) is checked the first time and the pair added."""
    info = header[name]
    begin, end = info["data_offsets"]
    dtype, shape = _FROM_ST[info["dtype"]], tuple(info["shape"])
    path = Path(path)
    try:
        arr = _read(path, root, dtype, shape, data_start + begin, end - begin)
    except (OSError, ValueError) as e:
        raise DamagedFileError(f"damaged dump file {path}: {name!r}: {e}") from None
    if verified is not None and (path, name) not in verified:
        _verify(path, name, header, arr)
        verified.add((path, name))
    return arr


def load_ranged(r: "Ranged", name: str, header: dict, data_start: int, *,
                verified: set | None = None) -> np.ndarray:
    """Tensor ``name`` of the file open as ``r`` (an object in a store): one range request for
    its bytes, never the whole file; CRC32 checked as in :func:`load`."""
    info = header[name]
    begin, end = info["data_offsets"]
    dtype, shape = _FROM_ST[info["dtype"]], tuple(info["shape"])
    n = end - begin
    if data_start + end > r.size:
        raise DamagedFileError(f"damaged dump file {r.name}: {name!r}: the file is {r.size:,} "
                               "bytes, too short for bytes "
                               f"{data_start + begin:,}..{data_start + end:,} (truncated?)")
    raw = r.pread(data_start + begin, n) if n else b""
    if len(raw) != n:
        raise DamagedFileError(f"damaged dump file {r.name}: {name!r}: {len(raw):,} of {n:,} bytes "
                               f"read (truncated while read?)")
    arr = np.frombuffer(bytearray(raw), dtype).reshape(shape) if n else np.zeros(shape, dtype)
    if verified is not None and (r.name, name) not in verified:
        _verify(Path(r.name), name, header, arr)
        verified.add((r.name, name))
    return arr


def _read(path: Path, root: Path | None, dtype: np.dtype, shape: tuple, offset: int,
          nbytes: int) -> np.ndarray:
    if nbytes == 0:
        return np.zeros(shape, dtype)
    with open_regular(path, root) as f:
        size = os.fstat(f.fileno()).st_size
        if offset + nbytes > size:
            raise ValueError(f"the file is {size:,} bytes, too short for bytes "
                             f"{offset:,}..{offset + nbytes:,} (truncated?)")
        if nbytes > READ_MAX:  # mapped: see FORMAT.md for the window this leaves
            return np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=shape)
        arr = np.empty(nbytes // dtype.itemsize, dtype)
        view, got = memoryview(arr).cast("B"), 0
        while got < nbytes:
            n = os.preadv(f.fileno(), [view[got:]], offset + got)
            if n == 0:
                raise ValueError(f"the file ended after {offset + got:,} bytes (truncated while "
                                 "read)")
            got += n
    return arr.reshape(shape)


def _verify(path: Path, name: str, header: dict, arr: np.ndarray) -> None:
    expected = crcs(header).get(name)
    if expected is None:
        return
    actual = zlib.crc32(_bytes(arr)) if arr.nbytes else 0
    if actual != expected:
        raise DamagedFileError(f"damaged dump file {path}: the bytes of {name!r} do not match "
                               f"their CRC32 (stored {expected:#010x}, read {actual:#010x}); the "
                               "file is corrupted")
