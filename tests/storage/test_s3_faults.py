"""Object-storage faults survived (storage/retry.py's policy and wrapper): a dataset build writing to a real
S3-protocol server (moto on loopback) through a fault-injecting proxy (tests/_fault_proxy.py: 503 SlowDown on every
fifth request, the connection dropped mid-answer on every ninth) completes with the same bytes as a fault-free one,
in the plain loop and on Ray Data (whose workers make the steps' requests)."""
from __future__ import annotations

import pytest
from _fault_proxy import FaultProxy

from corpus.create_instances import InstanceConfig
from pipeline import BuildConfig, build
from storage import fs as storage_fs

pytestmark = pytest.mark.timeout(600)


def _config(sample_dir, output: str, endpoint: str) -> BuildConfig:
    return BuildConfig(inputs=(str(sample_dir / "corpus" / "mobydick.jsonl.gz"),), output=output, dupe_factor=2,
                       num_shards=3, vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                       instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10), unit_bytes=256 << 10,
                       endpoint_url=endpoint)


def _listing(url: str, endpoint: str) -> dict[str, bytes]:
    fs, root = storage_fs.filesystem_for(url, endpoint)
    fs.invalidate_cache()
    return {p[len(root):]: fs.cat_file(p) for p in fs.find(root)}


@pytest.mark.parametrize("engine", ["loop", "ray-data"])
def test_a_build_through_faults_gives_the_same_bytes(s3_bucket, sample_dir, engine, request):
    endpoint, bucket = s3_bucket

    def executor():
        if engine == "loop":
            return None  # the plain loop in this process
        request.getfixturevalue("ray_local")
        from pipeline.ray_data import RayDataExecutor

        return RayDataExecutor(num_cpus=2)  # the steps' S3 requests come from Ray's worker processes

    clean = build(_config(sample_dir, f"s3://{bucket}/clean", endpoint), executor())
    with FaultProxy(endpoint) as proxy:
        faulty = build(_config(sample_dir, f"s3://{bucket}/faulty", proxy.url), executor())
    assert proxy.counts["slowdown"] >= 3 and proxy.counts["dropped"] >= 2, proxy.counts
    for key in ("config", "config_hash", "shard_rows", "totals", "seq_len_histogram"):
        assert getattr(faulty, key) == getattr(clean, key), key
    assert faulty.vocab.sha256 == clean.vocab.sha256
    got, expected = _listing(f"s3://{bucket}/faulty", endpoint), _listing(f"s3://{bucket}/clean", endpoint)
    assert sorted(got) == sorted(expected)  # no leftovers: no _work, no probe; the lease record, released
    assert "/_writer.lease.json" in got
    for name, data in expected.items():
        if name not in ("/manifest.json", "/_writer.lease.json"):  # they name their own output, holder and times
            assert got[name] == data, name


def test_a_throttle_that_outlasts_the_retries_fails_the_build(s3_bucket, sample_dir, monkeypatch):
    """Issue 30, item 10: an input whose reads are throttled (503 SlowDown) past every retry is the store's failure,
    not a corrupt file: even with --on-error skip the build fails, in one line naming the input, and writes no
    manifest (it used to skip the input as corrupt_file and exit 0 with its documents silently gone)."""
    import boto3

    import storage.retry as retry
    from corpus.readers import ReadOptions

    endpoint, bucket = s3_bucket
    boto3.client("s3", endpoint_url=endpoint).upload_file(str(sample_dir / "corpus" / "mobydick.jsonl.gz"), bucket,
                                                           "in/moby.jsonl.gz")
    monkeypatch.setattr(retry, "S3_RETRIES", {"max_attempts": 2, "mode": "standard"})  # the retries run out soon
    with FaultProxy(endpoint, slow_every=10**9, drop_every=10**9) as proxy:
        proxy.unavailable("in/moby.jsonl.gz", seconds=600, methods=("GET",))  # listed fine, never read
        cfg = BuildConfig(inputs=(f"s3://{bucket}/in/moby.jsonl.gz",), output=f"s3://{bucket}/out", dupe_factor=1,
                          num_shards=1, vocab=str(sample_dir / "reference" / "bert-base-uncased-vocab.txt"),
                          instances=InstanceConfig(max_seq_length=64, max_predictions_per_seq=10),
                          read=ReadOptions(on_error="skip"), endpoint_url=proxy.url)
        with pytest.raises(ValueError, match=r"cannot read input s3://.*moby\.jsonl\.gz.*reduce your request rate"):
            build(cfg)
    assert not storage_fs.exists(f"s3://{bucket}/out/manifest.json", endpoint)


def test_a_body_cut_short_that_fails_its_checksum_is_read_again():
    """What a suite run met once (2026-11-28): a lease read through the proxy got a body cut short without an error
    from the connection, and botocore's checksum check raised FlexibleChecksumError, which was not retried, so the
    writer's fence check failed the build. It is a transfer fault: read again; a checksum that never matches still
    fails once the tries are spent."""
    from botocore.exceptions import FlexibleChecksumError

    from storage.retry import is_transient, retrying

    cut = FlexibleChecksumError(error_msg="Expected checksum dPbjKQ== did not match calculated checksum: AAAAAA==")
    assert is_transient(cut)
    calls = []

    def read() -> bytes:
        calls.append(1)
        if len(calls) == 1:
            raise cut
        return b"{}"

    assert retrying(read, "read the lease") == b"{}" and len(calls) == 2

    def never() -> bytes:
        raise cut

    with pytest.raises(FlexibleChecksumError):
        retrying(never, "read the lease", attempts=2)
