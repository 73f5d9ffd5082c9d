"""Inputs over http(s) are identified by more than their size: a real http.server on 127.0.0.1 that sends no ETag
(and, in the worst case, no Last-Modified either) serves a corpus; an edit that keeps its size is seen (its bytes'
digest is part of the input's stamp), so a finished build of the old bytes is refused rather than served stale, and
a build of the new bytes reads them."""
from __future__ import annotations

import functools
import gzip
import http.server
import threading

import pytest

from corpus.create_instances import InstanceConfig
from pipeline import BuildConfig, build
from storage.fs import expand_inputs


class _NoValidators(http.server.SimpleHTTPRequestHandler):
    """Serves files with neither an ETag nor a Last-Modified header (http.server sends no ETag anyway)."""

    def send_header(self, keyword, value):
        if keyword.lower() not in ("etag", "last-modified"):
            super().send_header(keyword, value)

    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_NoValidators, directory=str(root)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _corpus(sample_dir, word: str) -> bytes:
    """Moby Dick's first chapters with every "whale" replaced by a five-letter word: same size, other text."""
    with gzip.open(sample_dir / "corpus" / "mobydick.jsonl.gz", "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(12)]
    assert len(word) == len("whale")
    return "".join(lines).replace("whale", word).encode("utf-8")


def _config(url: str, output, sample_dir) -> BuildConfig:
    return BuildConfig(inputs=(url,), output=str(output), dupe_factor=1, num_shards=1,
                       vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                       instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10))


def test_a_same_size_edit_without_etag_is_not_served_stale(server, tmp_path, sample_dir):
    root, base = server
    url = f"{base}/corpus.jsonl"
    (root / "corpus.jsonl").write_bytes(_corpus(sample_dir, "whale"))
    (before,) = expand_inputs([url])
    assert before.etag is None and before.mtime is None and before.digest.startswith("sha256:")

    first = build(_config(url, tmp_path / "out", sample_dir))
    assert build(_config(url, tmp_path / "out", sample_dir)).sha256 == first.sha256  # unchanged: already complete

    (root / "corpus.jsonl").write_bytes(_corpus(sample_dir, "ships"))
    (after,) = expand_inputs([url])
    assert after.size == before.size and after.digest != before.digest
    with pytest.raises(ValueError, match=r"holds a finished dataset built from other versions of the inputs .*"
                                         r"corpus.jsonl: digest sha256:\w+ -> sha256:\w+"):
        build(_config(url, tmp_path / "out", sample_dir))
    fresh = build(_config(url, tmp_path / "fresh", sample_dir))  # the new bytes, read as they are now
    assert fresh.inputs[0]["digest"] == after.digest
    (shard,) = [s.file for s in first.shards]
    assert (tmp_path / "fresh" / shard).read_bytes() != (tmp_path / "out" / shard).read_bytes()


def test_a_server_with_an_etag_costs_no_digest(tmp_path):
    class _WithETag(_NoValidators):
        def end_headers(self):
            super(_NoValidators, self).send_header("ETag", '"v1"')
            super().end_headers()

    root = tmp_path / "www"
    root.mkdir()
    (root / "c.txt").write_text("A line of text.\n")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_WithETag, directory=str(root)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        (info,) = expand_inputs([f"http://127.0.0.1:{httpd.server_address[1]}/c.txt"])
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert info.etag == "v1" and info.digest is None


def test_a_presigned_url_is_read_in_the_format_its_path_names(server, tmp_path, sample_dir):
    """Issue 30, item 12: ``corpus.jsonl?X-Amz-Signature=...`` is JSON Lines (the query is no extension): each record
    is a document, not one document of JSON syntax."""
    from corpus.readers import input_format

    root, base = server
    (root / "corpus.jsonl").write_bytes(_corpus(sample_dir, "whale"))
    query = "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIDEXAMPLE&X-Amz-Signature=0123abcd"
    assert input_format(f"{base}/corpus.jsonl.gz?{query}") == "jsonl"
    assert input_format(f"{base}/corpus.parquet?{query}") == "parquet"
    manifest = build(_config(f"{base}/corpus.jsonl?{query}", tmp_path / "out", sample_dir))
    assert manifest.totals.documents == 12  # the 12 records, each a chapter
