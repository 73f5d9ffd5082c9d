"""The data order and each rank's micro-batches as they were before the loader read only its share (issue 45):
recorded on real builds (the fixtures' tiny_pretrain_data and varied_pretrain_data as built when recorded,
frozen in tests/pretraining/frozen), so a loader that reads less cannot train other examples, other masks or
another split (check train-batches-any-world: the same 60 step digests on 1, 2 and 4 workers, recorded). Each is
checked on the dataset as built before shards had indexes (every shard read whole) and with indexes (each rank
reads its own rows: row groups of 16 rows here, so a rank reads parts of shards)."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from corpus.schema import read_manifest
from pretraining import batches
from pretraining.loader import DataConfig, rank_steps, share_reader
from tests.pretraining.indexed import add_index, strip_index

# sha256[:16] of the 60 step digests (steps 1-60, --batch-size 32 --seed 7) joined by spaces, and step 1's digest.
DIGESTS = {
    ("tiny", ()): ("ea7f8895db99eabf", "48c5857fa667e5c4"),
    ("tiny", ("--dynamic-masking",)): ("ea7f8895db99eabf", "48c5857fa667e5c4"),
    ("tiny", ("--packing",)): ("b68ed98d083a00b8", "93687a7f82b4c2f8"),
    ("tiny", ("--no-length-bucketing",)): ("8ea5277919c8ef82", "48c5857fa667e5c4"),
    ("tiny", ("--packing", "--dynamic-masking")): ("b68ed98d083a00b8", "93687a7f82b4c2f8"),
    ("varied", ()): ("9982d23f44df4c38", "a512085769167191"),
    ("varied", ("--dynamic-masking",)): ("9982d23f44df4c38", "a512085769167191"),
    ("varied", ("--packing",)): ("f099bbedf758b0a9", "76f8dadb546071d4"),
    ("varied", ("--no-length-bucketing",)): ("7597ae6face962d2", "c6e6b1be5037798d"),
    ("varied", ("--packing", "--dynamic-masking")): ("f099bbedf758b0a9", "76f8dadb546071d4"),
}

# sha256[:16] of both ranks' micro-batches (`micro_batches_hash`), recorded with the loader before issue 45.
CONTENT = {
    ("tiny", "plain"): "4aa69471c4f5af99", ("tiny", "dyn"): "0a95eb135fb6b5bc",
    ("tiny", "packed"): "4f7c08a9d35ddd96", ("tiny", "packed-dyn"): "1ce03870b6746973",
    ("tiny", "nobucket-dyn"): "323e7b2dac5b795b",
    ("varied", "plain"): "220d75f5d83d9893", ("varied", "dyn"): "3f2dd3891777230a",
    ("varied", "packed"): "e0304d9a671c1657", ("varied", "packed-dyn"): "2e551d888561b0f2",
    ("varied", "nobucket-dyn"): "a6ecf8648e821225",
}
FLAGS = {"plain": {}, "dyn": {"dynamic_masking": True}, "packed": {"packing": True},
         "packed-dyn": {"packing": True, "dynamic_masking": True},
         "nobucket-dyn": {"length_bucketing": False, "dynamic_masking": True}}


FROZEN = Path(__file__).parent / "frozen"  # the fixtures' builds as the build wrote them on 2026-12-06 (no index)


@pytest.fixture(scope="module")
def variants(tmp_path_factory) -> dict[str, dict[str, str]]:
    """The datasets the digests were recorded on, frozen in the repo (a later build may place rows elsewhere):
    as built (no indexes: every shard read whole) and indexed with 16-row groups (each rank reads its rows)."""
    root = tmp_path_factory.mktemp("order-variants")
    return {"whole": {k: strip_index(FROZEN / k, root / f"whole-{k}") for k in ("tiny", "varied")},
            "indexed": {k: add_index(FROZEN / k, root / f"indexed-{k}", row_group_size=16) for k in ("tiny", "varied")}}


@pytest.fixture(params=["whole", "indexed"])
def datasets(request, variants) -> dict[str, str]:
    return variants[request.param]


@pytest.mark.parametrize("key", sorted(DIGESTS))
def test_step_digests_are_the_recorded_ones_on_1_2_and_4_workers(datasets, capsys, key):
    name, flags = key
    for workers in ("1", "2", "4"):
        assert batches.main(["--data", datasets[name], "--batch-size", "32", "--steps", "1:60", "--seed", "7",
                             "--num-workers", workers, *flags]) == 0
        found = re.findall(r"^step \d+: ([0-9a-f]{16})$", capsys.readouterr().out, re.M)
        assert len(found) == 60
        assert (hashlib.sha256(" ".join(found).encode()).hexdigest()[:16], found[0]) == DIGESTS[key], workers


def micro_batches_hash(url: str, flags: str, reader: bool) -> str:
    """sha256[:16] of every array of both ranks' micro-batches (world 2, micro-batch 8, steps 1-40, seed 7), their
    example ids and starts: the exact tensors the workers train on, masks included."""
    manifest = read_manifest(url)
    data = DataConfig(train=manifest, micro_batch_size=8, batch_size=32, mask_id=manifest.vocab.mask_id,
                      **FLAGS[flags]).for_world(2)
    assert (share_reader(data) is not None) == reader
    h = hashlib.sha256()
    for rank in range(2):
        for _, share in zip(range(40), rank_steps(data, manifest.vocab.size, 7, rank, 2), strict=False):
            for micro in share.micro:
                for k in sorted(micro):
                    h.update(k.encode())
                    h.update(micro[k].tobytes())
            for e in share.examples:
                h.update(e.tobytes())
            h.update(repr(share.starts).encode())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("flags", sorted(FLAGS))
@pytest.mark.parametrize("name", ["tiny", "varied"])
def test_each_ranks_micro_batches_are_the_same_read_whole_or_by_its_share(variants, name, flags):
    """Reading only a rank's rows (indexed, row groups of 16 rows) gives the very tensors reading every shard
    whole gives (the code path of datasets without indexes), masks included: the ones recorded before."""
    assert micro_batches_hash(variants["indexed"][name], flags, True) == \
        micro_batches_hash(variants["whole"][name], flags, False) == CONTENT[name, flags]
