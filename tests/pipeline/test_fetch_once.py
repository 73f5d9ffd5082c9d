"""Each byte fetched once: what an http server (ETags, byte ranges, as object stores serve reads) and an S3 server
(moto) send to the preflight, to the pieces step and to a whole build, counted by a proxy in front of them, for one
big file and 1,000 tiny ones, plain and ``.gz``. Before: the preflight read each sampled head with the client's
default block (6 MiB over http, ~51 MiB on S3 for one MiB sampled), the pieces step read a ``.gz`` 1.61x (fsspec's
BytesCache), the inputs were listed twice, and a build over http read its input 1.73x."""
from __future__ import annotations

import gzip
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from _counting_proxy import CountingProxy
from _ranged_http import RangedStore

from corpus.readers import ReadOptions
from pipeline.config import BuildConfig
from pipeline.inputs import read_inputs
from pipeline.inputs.pieces import PieceContext, PieceItem, pieces_step
from pipeline.preflight import check_build
from pipeline.preflight.heads import HEAD_BYTES, sample_inputs

TECH = "/work/shared/data/corpora/tech.jsonl.gz"
BIG = 6_000_000  # bytes of JSON Lines in the big file: bigger than the clients' default blocks over http
MANY = 1000


def _records() -> list[bytes]:
    out, total = [], 0
    with gzip.open(TECH, "rb") as f:
        for line in f:
            out.append(line)
            total += len(line)
            if total >= BIG:
                return out
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, bytes]:
    """{name: stored bytes}: big.jsonl (6 MB of tech.jsonl), big.jsonl.gz, and 1,000 tiny files of each kind."""
    records = _records()
    big = b"".join(records)
    out = {"big.jsonl": big, "big.jsonl.gz": gzip.compress(big, compresslevel=6),
           "tech.jsonl.gz": open(TECH, "rb").read()}  # 11.2 MB stored: more than a client's default block
    for i in range(MANY):
        rec = json.loads(records[i % len(records)])
        line = json.dumps({"id": f"t{i}", "text": rec["text"][:1500]}).encode() + b"\n"
        out[f"many/{i:04d}.jsonl"] = line
        out[f"manygz/{i:04d}.jsonl.gz"] = gzip.compress(line)
    return out


@pytest.fixture(scope="module")
def http_store(files, tmp_path_factory):
    root = tmp_path_factory.mktemp("www")
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    with RangedStore(root) as store, CountingProxy(store.url("").rstrip("/")) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def s3_store(files, s3_server):
    import uuid

    import boto3

    bucket = f"fetch-{uuid.uuid4().hex[:10]}"
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    s3.create_bucket(Bucket=bucket)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda kv: s3.put_object(Bucket=bucket, Key=kv[0], Body=kv[1]), files.items()))
    with CountingProxy(s3_server) as proxy:
        yield proxy, bucket


def _inputs(where: str, proxy: CountingProxy, bucket: str | None, what: str) -> tuple[list[str], str, str | None]:
    """(the --input URLs, the path prefix the store sees, the endpoint) of one case."""
    if where == "http":  # an http store has no listing: 1,000 files are 1,000 URLs
        names = [what] if "." in what else [f"{what}/{i:04d}.jsonl" + (".gz" if what == "manygz" else "")
                                                       for i in range(MANY)]
        return [f"{proxy.url}/{n}" for n in names], f"/{what}", None
    url = f"s3://{bucket}/{what}" + ("" if "." in what else "/")
    return [url], f"/{bucket}/{what}", proxy.url


CASES = [(w, what) for w in ("http", "s3") for what in ("big.jsonl", "big.jsonl.gz", "many", "manygz")]


def _store(where, request):
    return (request.getfixturevalue("http_store"), None) if where == "http" else request.getfixturevalue("s3_store")


@pytest.mark.parametrize("where,what", CASES)
def test_the_preflight_reads_only_what_it_samples(where, what, files, request):
    proxy, bucket = _store(where, request)
    urls, prefix, endpoint = _inputs(where, proxy, bucket, what)
    from pipeline.inputs import list_inputs

    listed, _ = list_inputs(urls, endpoint)
    proxy.clear()
    samples = sample_inputs(listed, ReadOptions(), endpoint)
    sent = proxy.total(prefix)
    # What the samples hold: a whole small file, or the stored bytes the head came from (plain: HEAD_BYTES + 1).
    needed = sum(s.size if s.whole else s.listed for s in samples)
    assert len(samples) == (1 if what.startswith("big") else 16)
    if what == "big.jsonl":
        assert samples[0].listed == HEAD_BYTES + 1 and sent == HEAD_BYTES + 1, sent  # to the byte, one request
    assert needed <= sent <= 1.05 * needed, (sent, needed, len(files[what]) if what in files else None)


@pytest.mark.parametrize("where", ["http", "s3"])
def test_the_pieces_step_streams_a_gz_once(where, files, request, tmp_path):
    proxy, bucket = _store(where, request)
    (url,), prefix, endpoint = _inputs(where, proxy, bucket, "tech.jsonl.gz")
    proxy.clear()
    m = pieces_step(PieceItem(0, url, "tech.jsonl", "jsonl"),
                    PieceContext(str(tmp_path / "work"), 8 << 20, ReadOptions(), endpoint))
    assert m.decompressed_bytes == len(gzip.decompress(files["tech.jsonl.gz"])) and len(m.pieces) == 5
    stored = len(files["tech.jsonl.gz"])
    assert stored <= proxy.total(prefix) <= 1.05 * stored, (proxy.total(prefix), stored)  # 1.61x before


@pytest.mark.parametrize("what", ["big.jsonl.gz", "many"])
def test_the_inputs_are_listed_once_per_build(what, http_store, sample_dir, tmp_path):
    # The job's order: the preflight, then the build's own reading of its inputs. Each input URL is asked for its
    # size and ETag once (a HEAD over http), not once by each.
    urls, _, _ = _inputs("http", http_store, None, what)
    cfg = BuildConfig(inputs=tuple(urls), output=str(tmp_path / "out"),
                      vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"))
    def heads() -> dict[str, int]:
        return {path: n for (method, path), n in http_store.requests.items() if method == "HEAD"}

    http_store.clear()
    check_build(cfg.inputs, cfg.output, cfg.read, 128, 0.1, 1, None)
    assert len(heads()) == len(urls)  # the preflight lists them (and opening a sampled .gz asks again)
    http_store.clear()
    inputs = read_inputs(cfg)
    assert len(inputs.files) == len(urls) and heads() == {}  # the build takes the preflight's listing
    # A build without the preflight (or a second build) lists for itself.
    read_inputs(cfg)
    assert len(heads()) == len(urls) and set(heads().values()) == {1}
