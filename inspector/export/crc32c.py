"""CRC-32C (Castagnoli) of many byte strings at once, in numpy: the checksums of TFRecord
framing (TensorBoard's event files).

Why not per record in Python: the ``tensorboard`` package's TF-free writer checksums each
record in a pure-Python loop, far too slow for the hundreds of MB an export of a long run
writes. CRC-32C is linear over GF(2), so here every record is cut into 64-byte chunks (left-padded
with zeros, which do not change a CRC started from 0), all chunks are checksummed together one
byte column at a time, and each chunk's CRC is moved to its place in its record by the linear
map "append n zero bytes" (tables per power of two of n), then XORed.

:class:`Slots` goes further for records that differ from a fixed template only in a few byte
positions (a step's scalars at fixed offsets): the CRC of each record is the template's
XORed with one table lookup per variable byte.

>>> hex(int(crc32c([b"123456789"])[0]))   # the standard check value
'0xe3069283'
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

_POLY = 0x82F63B78   # CRC-32C, reflected
_MASK_DELTA = 0xA282EAD8
#: Bytes per chunk checksummed column by column (a multiple of 4: read as 32-bit words).
CHUNK = 256


def _byte_table() -> np.ndarray:
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> np.uint32(1)) ^ np.uint32(_POLY),
                     t >> np.uint32(1)).astype(np.uint32)
    return t


_T = _byte_table()


def _one_zero_byte(s: np.ndarray) -> np.ndarray:
    """The CRC register after one more zero byte (raw: no initial or final inversion)."""
    return _T[s & np.uint32(0xFF)] ^ (s >> np.uint32(8))


def _apply(tables: np.ndarray, s: np.ndarray) -> np.ndarray:
    """A linear map of 32-bit registers given by its 4 x 256 table (one per register byte)."""
    s = np.asarray(s, np.uint32)
    return (tables[0][s & 0xFF] ^ tables[1][(s >> 8) & 0xFF] ^ tables[2][(s >> 16) & 0xFF]
            ^ tables[3][s >> 24])


def _zero_tables(bits: int = 40) -> np.ndarray:
    """[bits, 4, 256]: entry b maps a register through 2**b zero bytes."""
    basis = (np.arange(256, dtype=np.uint32)[None, :]
             << (8 * np.arange(4, dtype=np.uint32))[:, None])
    out = np.empty((bits, 4, 256), np.uint32)
    out[0] = _one_zero_byte(basis)
    for b in range(1, bits):
        out[b] = _apply(out[b - 1], _apply(out[b - 1], basis))
    return out


_ZEROS = _zero_tables()
# a register through 4 zero bytes, by its low and its high 16 bits: 4 bytes in 2 lookups
_LO16 = _apply(_ZEROS[2], np.arange(1 << 16, dtype=np.uint32))
_HI16 = _apply(_ZEROS[2], np.arange(1 << 16, dtype=np.uint32) << np.uint32(16))


def append_zeros(s: np.ndarray, n: np.ndarray | int) -> np.ndarray:
    """Raw CRC registers ``s`` advanced through ``n`` zero bytes each (vectorised)."""
    s = np.array(s, np.uint32, copy=True, ndmin=1)
    n = np.broadcast_to(np.asarray(n, np.int64), s.shape)
    for b in range(int(n.max(initial=0)).bit_length()):
        on = ((n >> b) & 1).astype(bool)
        if on.any():
            s[on] = _apply(_ZEROS[b], s[on])
    return s


def _raw_rows(rows: np.ndarray) -> np.ndarray:
    """Raw CRCs (register from 0, no inversion) of the rows of a [n, w] uint8 array, w a
    multiple of 4: a reflected CRC takes 4 bytes as one little-endian word."""
    # each word column contiguous
    words = np.asfortranarray(np.ascontiguousarray(rows).view("<u4"))
    s = np.zeros(len(rows), np.uint32)
    for j in range(words.shape[1]):
        s ^= words[:, j]
        s = _LO16[s & np.uint32(0xFFFF)] ^ _HI16[s >> np.uint32(16)]
    return s


def crc32c(records: Sequence[bytes]) -> np.ndarray:
    """The CRC-32C of each of ``records`` (uint32)."""
    lengths = np.fromiter((len(r) for r in records), np.int64, len(records))
    chunks = -(-lengths // CHUNK)
    ends = np.cumsum(chunks) * CHUNK
    flat = np.zeros(int(ends[-1]) if len(ends) else 0, np.uint8)
    for r, end, n in zip(records, ends, lengths):
        # right-aligned: leading zeros keep a raw CRC
        flat[end - n:end] = np.frombuffer(r, np.uint8)
    return _finish(flat.reshape(-1, CHUNK), chunks, lengths)


def crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """The CRC-32C of each row of a [n, w] uint8 array (uint32)."""
    n, w = rows.shape
    pad = -w % CHUNK
    padded = np.zeros((n, w + pad), np.uint8)
    padded[:, pad:] = rows                      # left-padded: leading zeros keep a raw CRC
    return _finish(padded.reshape(-1, CHUNK), np.full(n, (w + pad) // CHUNK), np.full(n, w))


def _finish(chunks: np.ndarray, per_record: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """CRCs of records laid out as consecutive runs of ``per_record`` zero-led chunks."""
    raw = _raw_rows(chunks)
    starts = np.concatenate([[0], np.cumsum(per_record)]).astype(np.int64)
    owner = np.repeat(np.arange(len(per_record)), per_record)
    # each chunk's CRC moved to its place: followed by the chunks after it in its record
    raw = append_zeros(raw, (starts[1:][owner] - 1 - np.arange(len(raw))) * CHUNK)
    out = np.zeros(len(per_record), np.uint32)
    has = per_record > 0
    if has.any():
        out[has] = np.bitwise_xor.reduceat(raw, starts[:-1][has])
    # the standard CRC starts from 0xFFFFFFFF and inverts at the end: affine in the data
    return out ^ append_zeros(np.full(len(per_record), 0xFFFFFFFF, np.uint32), lengths) \
        ^ np.uint32(0xFFFFFFFF)


def masked(crc: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC: rotated right by 15 bits, plus a constant."""
    c = np.asarray(crc, np.uint32)
    return (((c >> np.uint32(15)) | (c << np.uint32(17)))
            + np.uint32(_MASK_DELTA)).astype(np.uint32)


class Slots:
    """CRC-32Cs of records equal to ``template`` except at byte positions ``positions``.

    >>> s = Slots(b"ab??e", [2, 3])
    >>> int(s.crc(np.frombuffer(b"cd", np.uint8)[None])[0]) == int(crc32c([b"abcde"])[0])
    True
    """

    def __init__(self, template: bytes, positions: Sequence[int] | np.ndarray) -> None:
        pos = np.asarray(positions, np.int64)
        base = np.frombuffer(template, np.uint8).copy()
        base[pos] = 0
        self.base = int(crc32c([base.tobytes()])[0])
        # a byte v alone at position p of a record of length L: T[v] then L - 1 - p zero bytes;
        # linear in v, so from its 8 bits' values
        bits = append_zeros(np.tile(_T[1 << np.arange(8)], len(pos)),
                            np.repeat(len(base) - 1 - pos, 8))
        bits = bits.reshape(len(pos), 8)
        tables = np.zeros((len(pos), 256), np.uint32)
        for i in range(8):
            tables[:, 1 << i:2 << i] = tables[:, :1 << i] ^ bits[:, i:i + 1]
        self.tables = tables.ravel()
        self.offsets = (np.arange(len(pos), dtype=np.int32) * 256)[:, None]

    def crc(self, values: np.ndarray) -> np.ndarray:
        """The CRC of each record whose bytes at ``positions`` are a row of
        ``values`` [n, len(positions)]."""
        # slot-major: each slot's 1 KiB table stays in cache while every record looks it up
        picked = np.take(self.tables, self.offsets + np.asarray(values, np.uint8).T)   # [slots, n]
        return np.bitwise_xor.reduce(picked, axis=0) ^ np.uint32(self.base)
