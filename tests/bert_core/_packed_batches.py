"""The same sequences as a padded batch and as packed rows, for the packed-model tests (CPU and GPU)."""
from __future__ import annotations

import torch

import bert_core

V, WIDTH = 300, 40
LENGTHS = [[9, 14, 11], [17, 6, 0]]  # two packed rows of 40 positions; row 1 has an unused place


def cfg(**kw):
    """bert_tiny without dropout unless `kw` turns it on."""
    return bert_core.bert_tiny(**{"vocab_size": V, "max_position_embeddings": 64, "hidden_dropout_prob": 0.0,
                                  "attention_probs_dropout_prob": 0.0, **kw})


def make_sequences(seed: int = 0) -> list[dict]:
    """One dict per sequence: ids ([CLS] first), token types (A then B), masked positions/labels, NSP label."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in [n for row in LENGTHS for n in row if n]:
        ids = torch.randint(5, V, (n,), generator=g)
        ids[0] = 2
        a_end = int(torch.randint(2, n - 1, (1,), generator=g))
        types = (torch.arange(n) >= a_end).long()
        k = max(1, round(0.15 * n))
        pos = torch.randperm(n - 1, generator=g)[:k].sort().values + 1
        out.append(dict(ids=ids, types=types, pos=pos, lab=torch.randint(5, V, (k,), generator=g),
                        nsp=int(torch.randint(0, 2, (1,), generator=g))))
    return out


def unpacked_batch(seqs: list[dict], p: int) -> dict:
    n, t = len(seqs), max(len(s["ids"]) for s in seqs)
    batch = dict(input_ids=torch.zeros(n, t, dtype=torch.long), attention_mask=torch.zeros(n, t, dtype=torch.long),
                 token_type_ids=torch.zeros(n, t, dtype=torch.long), masked_lm_positions=torch.zeros(n, p).long(),
                 masked_lm_labels=torch.full((n, p), -100), next_sentence_label=torch.tensor([s["nsp"] for s in seqs]))
    for i, s in enumerate(seqs):
        m, k = len(s["ids"]), len(s["pos"])
        batch["input_ids"][i, :m], batch["attention_mask"][i, :m], batch["token_type_ids"][i, :m] = s["ids"], 1, \
            s["types"]
        batch["masked_lm_positions"][i, :k], batch["masked_lm_labels"][i, :k] = s["pos"], s["lab"]
    return batch


def packed_batch(seqs: list[dict], p: int) -> dict:
    rows, s_max = len(LENGTHS), len(LENGTHS[0])
    batch = dict(input_ids=torch.randint(5, V, (rows, WIDTH)),  # padding content is arbitrary on purpose
                 token_type_ids=torch.randint(0, 2, (rows, WIDTH)), sequence_lengths=torch.tensor(LENGTHS),
                 masked_lm_positions=torch.zeros(rows, p).long(), masked_lm_labels=torch.full((rows, p), -100),
                 next_sentence_label=torch.full((rows, s_max), -100))
    it = iter(seqs)
    for r, row in enumerate(LENGTHS):
        at, slot = 0, 0
        for j, n in enumerate(row):
            if not n:
                continue
            s = next(it)
            k = len(s["pos"])
            batch["input_ids"][r, at:at + n], batch["token_type_ids"][r, at:at + n] = s["ids"], s["types"]
            batch["masked_lm_positions"][r, slot:slot + k] = s["pos"] + at
            batch["masked_lm_labels"][r, slot:slot + k] = s["lab"]
            batch["next_sentence_label"][r, j] = s["nsp"]
            at, slot = at + n, slot + k
    return batch


def spans():
    """(row, place in the row, start, length) of every packed sequence, in the order of make_sequences."""
    return [(r, j, sum(row[:j]), n) for r, row in enumerate(LENGTHS) for j, n in enumerate(row) if n]
