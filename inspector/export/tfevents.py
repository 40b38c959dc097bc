"""TensorBoard event files written without TensorFlow: scalars and histograms, many at once.

An event file is a sequence of TFRecords (length, masked CRC-32C of the length, an ``Event``
protobuf, masked CRC-32C of it). The protobuf messages come from the ``tensorboard`` package's
own classes (``tensorboard.compat.proto``, no TensorFlow); what is not taken from its writer
(``tensorboard.summary.writer.EventFileWriter``) is the per-record work: its CRC runs in pure
Python, far too slow for the hundreds of MB of a long run's export. Here:

* a step's scalars are one event whose bytes differ from the previous step's only at fixed
  offsets (the wall time, the step, each value's 4 bytes) when the same tags are present, so
  a batch of steps is one template tiled with numpy, and its checksums come from
  :class:`inspector.export.crc32c.Slots`;
* other records are checksummed together by :func:`inspector.export.crc32c.crc32c`.

Scalars are ``simple_value`` float32s: TensorBoard's data server (its default loader) reads a
scalar as a float32 whatever was written, and reads no float64 tensor as a scalar. Histograms
are float64 ``[k, 3]`` tensors (left edge, right edge, count) with the ``histograms`` plugin's
metadata, as ``tensorboard.summary.v2`` writes them, the metadata with a tag's first value in
the file (TensorBoard keeps a tag's first metadata).

Example::

    f = EventFile(Path("tb/exp1/all/train"))
    f.scalars(["loss"], np.array([0, 1]), np.array([[0.9], [0.7]]), np.ones((2, 1), bool))
    f.histograms([(0, [("gradient/conv1", np.array([[0.0, 1.0, 5.0]]))])])
    f.close()
"""
from __future__ import annotations

import itertools
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from inspector.errors import InspectorError
from inspector.export.crc32c import Slots, crc32c, crc32c_rows, masked

#: What the ``tensorboard`` extra installs; the export says it when the package is missing.
INSTALL = "pip install 'tf-inspector[tensorboard]'"
#: Steps encoded per numpy batch (a batch's records are in memory at once: ~100 KB a step).
BATCH = 256
#: Below this many steps sharing one layout, their records are checksummed one by one
#: (building a :class:`Slots` costs about as much as 50 such records).
SLOTS_FROM = 48
_SEQ = itertools.count()


def protos() -> Any:
    """The ``tensorboard`` package's protobuf modules (a namespace), or an InspectorError saying
    what to install."""
    try:
        from tensorboard.compat.proto import (event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2,
                                              types_pb2)
    except ImportError as e:
        raise InspectorError(f"the TensorBoard export needs the tensorboard package ({e}): "
                             f"{INSTALL}") from None
    import types
    return types.SimpleNamespace(event=event_pb2, summary=summary_pb2, tensor=tensor_pb2,
                                 shape=tensor_shape_pb2, types=types_pb2)


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative integer."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def varint_bytes(values: np.ndarray, width: int) -> np.ndarray:
    """[n, width] uint8: the varints of ``values`` (each needing exactly ``width`` bytes)."""
    v = np.asarray(values, np.uint64)[:, None] \
        >> (np.uint64(7) * np.arange(width, dtype=np.uint64))[None, :]
    out = (v & np.uint64(0x7F)).astype(np.uint8)
    out[:, :-1] |= 0x80
    return out


def varint_width(values: np.ndarray) -> np.ndarray:
    """Bytes of each value's varint (values >= 0)."""
    v = np.asarray(values, np.uint64)
    width = np.ones(v.shape, np.int64)
    for k in range(1, 10):
        width += v >= np.uint64(1) << np.uint64(7 * k)
    return width


def frame(payloads: Sequence[bytes]) -> bytes:
    """TFRecords of ``payloads``, concatenated."""
    if not payloads:
        return b""
    heads = [struct.pack("<Q", len(p)) for p in payloads]
    head_crc, body_crc = masked(crc32c(heads)), masked(crc32c(payloads))
    return b"".join(h + struct.pack("<I", hc) + p + struct.pack("<I", bc)
                    for h, hc, p, bc in zip(heads, head_crc.tolist(), payloads, body_crc.tolist()))


def event_bytes(step: int, wall_time: float, summary: bytes) -> bytes:
    """An ``Event`` with ``wall_time`` (field 1), ``step`` (2) and ``summary`` (5)."""
    return b"\x09" + struct.pack("<d", wall_time) + b"\x10" + varint(step) + _len_field(5, summary)


class EventFile:
    """A new event file in ``folder`` (``events.out.tfevents.<time>.<host>.<pid>.<n>``,
    TensorBoard's naming), appended to by :meth:`scalars` and :meth:`histograms`."""

    def __init__(self, folder: Path) -> None:
        self.pb = protos()
        folder.mkdir(parents=True, exist_ok=True)
        name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
                f"{os.getpid()}.{next(_SEQ)}")
        self.path = folder / name
        self._f = open(self.path, "xb")
        #: tags written to this file (a histogram's metadata goes with its first value)
        self.described: set[str] = set()
        self._entries: dict[str, tuple[bytes, int]] = {}
        self._layouts: dict[tuple, Slots] = {}
        first = self.pb.event.Event(wall_time=time.time(), file_version="brain.Event:2")
        self._f.write(frame([first.SerializeToString()]))

    def _histogram_metadata(self) -> Any:
        s = self.pb.summary
        return s.SummaryMetadata(plugin_data=s.SummaryMetadata.PluginData(plugin_name="histograms"),
                                 data_class=s.DATA_CLASS_TENSOR)

    def _entry(self, tag: str) -> tuple[bytes, int]:
        """A scalar's ``Summary.value`` entry and the offset of its float32 in it."""
        if tag not in self._entries:
            sentinel = struct.pack("<f", 1.2345e-30)
            raw = self.pb.summary.Summary.Value(tag=tag,
                                                simple_value=1.2345e-30).SerializeToString()
            if not raw.endswith(sentinel):   # simple_value (field 2) is serialised after the tag
                raise AssertionError(f"unexpected protobuf layout of a scalar value: {raw!r}")
            head = varint(1 << 3 | 2) + varint(len(raw))
            self._entries[tag] = (head + raw, len(head) + len(raw) - 4)
        return self._entries[tag]

    def scalars(self, tags: Sequence[str], steps: np.ndarray, values: np.ndarray,
                present: np.ndarray) -> None:
        """One event per step (``steps`` ascending, >= 0) holding the ``present`` [S, T] values
        of ``values`` [S, T] under ``tags`` [T], as float32 (what TensorBoard's data server
        keeps of a scalar)."""
        steps = np.asarray(steps, np.int64)
        if len(steps) and (steps.min() < 0 or np.any(np.diff(steps) <= 0)):
            raise ValueError(f"steps must be >= 0 and ascending, got {steps[:5].tolist()}...")
        for a in range(0, len(steps), BATCH):
            self._scalar_batch(list(tags), steps[a:a + BATCH],
                               np.asarray(values[a:a + BATCH], np.float32),
                               np.asarray(present[a:a + BATCH], bool))

    def _scalar_batch(self, tags: list[str], steps: np.ndarray, values: np.ndarray,
                      present: np.ndarray) -> None:
        wall = time.time()
        width = varint_width(steps)
        # steps with the same tags present and step width share a layout
        groups: dict[bytes, list[int]] = {}
        for i in np.flatnonzero(present.any(1)):
            groups.setdefault(np.packbits(present[i]).tobytes() + bytes([width[i]]),
                              []).append(int(i))
        records: dict[int, np.ndarray] = {}
        for rows in groups.values():
            cols = np.flatnonzero(present[rows[0]])
            encoded = self._encode([tags[j] for j in cols], int(width[rows[0]]), steps[rows],
                                   values[np.ix_(rows, cols)], wall)
            records.update(zip(rows, encoded))
        for i in sorted(records):
            self._f.write(records[i])
        self.described.update(t for t, used in zip(tags, present.any(0)) if used)

    def _encode(self, tags: list[str], width: int, steps: np.ndarray, values: np.ndarray,
                wall: float) -> np.ndarray:
        """Framed records [n, bytes] of ``steps`` sharing one layout: the event's template, its
        variable bytes (wall time, step varint, each value's 4 bytes) filled in with numpy."""
        entries = [self._entry(t) for t in tags]
        summary = b"".join(e for e, _ in entries)
        head = b"\x09" + bytes(8) + b"\x10" + bytes(width) + b"\x2a" + varint(len(summary))
        starts = np.cumsum([0] + [len(e) for e, _ in entries[:-1]], dtype=np.int64) + len(head)
        floats = (starts + np.array([o for _, o in entries], np.int64))[:, None] + np.arange(4)
        positions = np.concatenate([np.arange(1, 9), 10 + np.arange(width), floats.ravel()])
        event = head + summary
        var = np.concatenate([np.broadcast_to(np.frombuffer(struct.pack("<d", wall), np.uint8),
                                              (len(steps), 8)),
                              varint_bytes(steps, width),
                              np.ascontiguousarray(values, "<f4").view(np.uint8).reshape(
                                  len(steps), -1)], axis=1)
        rec = np.empty((len(steps), 12 + len(event) + 4), np.uint8)
        length = struct.pack("<Q", len(event))
        rec[:, :12] = np.frombuffer(length + struct.pack("<I", int(masked(crc32c([length]))[0])),
                                    np.uint8)
        rec[:, 12:-4] = np.frombuffer(event, np.uint8)
        rec[:, 12 + positions] = var
        if len(steps) >= SLOTS_FROM:
            key = (tuple(tags), width)
            if key not in self._layouts:
                self._layouts[key] = Slots(event, positions)
            crc = self._layouts[key].crc(var)
        else:
            crc = crc32c_rows(rec[:, 12:-4])
        rec[:, -4:] = masked(crc).astype("<u4").view(np.uint8).reshape(-1, 4)
        return rec

    def histograms(self, steps: Iterable[tuple[int, Sequence[tuple[str, np.ndarray]]]]) -> None:
        """One event per (step, [(tag, buckets [k, 3] float64: left, right, count)])."""
        pb, wall, payloads = self.pb, time.time(), []
        for step, items in steps:
            values = []
            for tag, buckets in items:
                b = np.ascontiguousarray(buckets, "<f8")
                shape = pb.shape.TensorShapeProto(dim=[pb.shape.TensorShapeProto.Dim(size=n)
                                                       for n in b.shape])
                v = pb.summary.Summary.Value(tag=tag, tensor=pb.tensor.TensorProto(
                    dtype=pb.types.DT_DOUBLE, tensor_shape=shape, tensor_content=b.tobytes()))
                if tag not in self.described:
                    v.metadata.CopyFrom(self._histogram_metadata())
                    self.described.add(tag)
                values.append(v)
            payloads.append(event_bytes(int(step), wall,
                                        pb.summary.Summary(value=values).SerializeToString()))
        self._f.write(frame(payloads))

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        self._f.close()
