"""Exact duplicates: a document's content hash.

Two documents are exact copies when their texts are equal after collapsing every run of whitespace to one space
and stripping the ends (a copy re-wrapped, re-indented or with a trailing newline is still a copy; one with a changed
character is not: that is what near deduplication is for). The hash is BLAKE2b-128 of that text's UTF-8 bytes: a
collision among 10**12 documents has probability ~10**-15.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import pyarrow as pa

DIGEST_BYTES = 16
CONTENT_TYPE = pa.binary(DIGEST_BYTES)


def content_hash(text: str | None) -> bytes:
    normal = " ".join((text or "").split())
    return hashlib.blake2b(normal.encode("utf-8", "surrogatepass"), digest_size=DIGEST_BYTES).digest()


def content_hashes(texts: Sequence[str | None]) -> pa.Array:
    return pa.array([content_hash(t) for t in texts], CONTENT_TYPE)
