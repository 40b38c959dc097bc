"""Large files on an object store stream as a multipart upload committed at the end (moto in
server mode, reached by s3fs over HTTP): the object reads back bit-identical, the writer never
holds more than one part of it, and an error before the end aborts the upload so no object
appears under the final name. Requests are recorded by an s3fs subclass (the client is not
patched); a refused part is injected there, as a server refusing it would answer."""
from __future__ import annotations

import numpy as np
import pytest

import inspector
from inspector.dumps.files import Encoded
from inspector.storage import FsspecStorage
from inspector.testing import SyntheticRun
from s3server import s3_fixture  # noqa: F401  (registers the fixture ``s3``)

PART = 5 << 20  # S3's smallest part: a 13 MiB dump is three parts


def _recording_fs(s3, fail_part: int | None = None):
    """An s3fs filesystem on the test server that records every S3 call (with the size of
    each part sent) and, with ``fail_part``, refuses that part number of every upload."""
    import s3fs
    from fsspec.asyn import sync_wrapper

    class Recording(s3fs.S3FileSystem):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.calls: list[tuple] = []

        async def _call_s3(self, method, *akwarglist, **kwargs):
            if method == "upload_part":
                if kwargs["PartNumber"] == fail_part:
                    raise OSError(f"injected: part {fail_part} refused")
                self.calls.append((method, len(kwargs["Body"])))
            else:
                self.calls.append((method, kwargs.get("Key")))
            return await super()._call_s3(method, *akwarglist, **kwargs)

        call_s3 = sync_wrapper(_call_s3)  # what S3File calls: s3fs binds it to its own _call_s3

        def sent(self) -> int:
            return sum(c[1] for c in self.calls if c[0] == "upload_part")

    return s3.filesystem(Recording)


def _dump(mib: int, seed: int = 0) -> Encoded:
    """A dump of ``mib`` MiB: one array larger than a part (sliced by the writer), small ones."""
    rng = np.random.default_rng(seed)
    arrays = {"forward/big:0": rng.standard_normal(((mib - 1) << 20) // 4).astype(np.float32)}
    arrays.update({f"forward/t{i}:0": rng.standard_normal((64, 1024)).astype(np.float32) for i in range(4)})
    return Encoded(arrays, {"step": "1"})


def _pending_uploads(fs, url: str) -> list[str]:
    bucket, key = url.split("://", 1)[1].split("/", 1)
    out = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key)
    return [u["Key"] for u in out.get("Uploads", [])]


def test_a_large_dump_streams_part_by_part_and_reads_back_identical(s3):
    fs = _recording_fs(s3)
    url = s3.url("stream")
    store = FsspecStorage(url, filesystem=fs)
    store.part_size = PART
    enc = _dump(13)
    want = b"".join(bytes(memoryview(c).cast("B")) for c in enc.chunks())
    held: list[int] = []  # bytes handed to the storage and not yet sent, after each chunk

    def chunks():
        given = 0
        for c in enc.chunks():
            yield c
            given += memoryview(c).nbytes
            held.append(given - fs.sent())

    assert store.write("dumps/chief.s0001.step-0000000001.safetensors", chunks(), size=enc.size) == len(want)
    parts = [c[1] for c in fs.calls if c[0] == "upload_part"]
    # every part but the last exactly one part size; the whole file went as parts
    assert len(parts) == -(-len(want) // PART) >= 3 and set(parts[:-1]) == {PART} and sum(parts) == len(want)
    # never more than a part waiting: whole-file buffering would hold ~13 MiB before the first part
    assert max(held) <= PART and held[0] < PART, held
    methods = [c[0] for c in fs.calls]
    assert methods.index("create_multipart_upload") < methods.index("upload_part")
    assert methods[-1] == "complete_multipart_upload" and "put_object" not in methods
    assert store.read("dumps/chief.s0001.step-0000000001.safetensors") == want
    assert _pending_uploads(fs, url) == []


def test_a_small_file_is_one_put(s3):
    fs = _recording_fs(s3)
    store = FsspecStorage(s3.url("small"), filesystem=fs)
    store.part_size = PART
    assert store.write("manifest.chief.s0001.json", [b'{"a": ', memoryview(b"1}")]) == 8
    assert [c[0] for c in fs.calls] == ["put_object"] and store.read("manifest.chief.s0001.json") == b'{"a": 1}'
    assert store.write("empty", []) == 0 and store.read("empty") == b""


@pytest.mark.parametrize("failure", ["iterator", "part"])
def test_an_error_midway_aborts_the_upload(s3, failure):
    """The chunk iterator raises after two parts were sent, or the server refuses part 2: the
    error reaches the caller, the multipart upload is aborted (no pending upload), and nothing
    exists under the final name, not even a truncated object."""
    fs = _recording_fs(s3, fail_part=2 if failure == "part" else None)
    url = s3.url("abort")
    store = FsspecStorage(url, filesystem=fs)
    store.part_size = PART
    enc = _dump(13)

    def chunks():
        for c in enc.chunks():
            yield c
            if failure == "iterator" and fs.sent() >= 2 * PART:
                raise RuntimeError("the dump's source failed")

    with pytest.raises((RuntimeError, OSError), match="source failed|injected"):
        store.write("dumps/x.safetensors", chunks(), size=enc.size)
    methods = [c[0] for c in fs.calls]
    assert "create_multipart_upload" in methods and "abort_multipart_upload" in methods
    assert "complete_multipart_upload" not in methods and "put_object" not in methods
    assert not fs.exists(f"{url}/dumps/x.safetensors") and store.list("dumps") == []
    assert _pending_uploads(fs, url) == []


def test_a_dump_whose_upload_fails_is_not_written(s3):
    """A writer's dump whose part 2 is refused: recorded as a write error, no dump file in the
    run, every other file readable and the reader reports no problem."""
    fs = _recording_fs(s3, fail_part=2)
    url = s3.url("writer")
    store = FsspecStorage(url, filesystem=fs)
    store.part_size = PART
    b = SyntheticRun(store, tensors=10, steps_hint=4, dump_every=None, stats_flush_secs=0)
    b.write_steps(0, 4)
    big = _dump(13)
    assert b.writer.add_dump(2, big.arrays)
    b.close()
    run = inspector.open_run(url, storage_options=s3.options)
    assert run.problems == [] and run.steps == [] and run.status == "finished"
    assert [e["what"] for e in run.manifest["errors"]] == ["dump"], run.manifest["errors"]
    assert "injected" in run.manifest["errors"][0]["reason"]
    assert len(run.query_stats(columns=["mean"])) and _pending_uploads(fs, url) == []
    assert not [k for k in fs.find(url) if "/dumps/" in k]
