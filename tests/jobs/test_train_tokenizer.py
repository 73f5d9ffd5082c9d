"""jobs/train_tokenizer.py trains on the same seeded, bounded sample as a build without --vocab: same vocabulary."""
from __future__ import annotations

import gzip
import json

from jobs import train_tokenizer
from pipeline.build import BuildConfig, build
from pipeline.create_instances import InstanceConfig

UNIT = 64 << 10


def _corpus(root, sample_dir):
    """Moby Dick and Austen as gzipped JSON Lines (real text, ~5 MB decompressed): both go through pieces."""
    root.mkdir()
    for name in ("mobydick", "austen"):
        raw = gzip.decompress((sample_dir / "corpus" / f"{name}.jsonl.gz").read_bytes())
        (root / f"{name}.jsonl.gz").write_bytes(gzip.compress(raw, compresslevel=1))
    return root


def test_train_tokenizer_job_uses_the_builds_sample(tmp_path, sample_dir, capsys):
    gz = _corpus(tmp_path / "gz", sample_dir)
    cfg = BuildConfig(inputs=(str(gz),), output=str(tmp_path / "ds"), vocab=None, vocab_size=300,
                      vocab_sample_bytes=300_000, unit_bytes=UNIT, dupe_factor=1, num_shards=2,
                      instances=InstanceConfig(max_seq_length=32, max_predictions_per_seq=5, seed=3))
    m = build(cfg)
    assert m.vocab.trained and m.vocab.size == 300
    assert train_tokenizer.main(["--input", str(gz), "--output", str(tmp_path / "v.txt"), "--vocab-size", "300",
                                 "--sample-bytes", "300000", "--unit-bytes", str(UNIT), "--seed", "3"]) == 0
    assert (tmp_path / "v.txt").read_bytes() == (tmp_path / "ds" / "vocab.txt").read_bytes()
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert 300_000 <= out["sampled_bytes"] < 300_000 + UNIT and out["sampled_blocks"] == -(-300_000 // UNIT)
