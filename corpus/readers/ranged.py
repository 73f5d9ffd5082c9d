"""A unit of a remote file read as a store should send it (``Ranged``): its own byte range in one request, then
the tail of its last document in small ones, so that a build's store sends about the input's bytes once."""
from __future__ import annotations

import io


class Ranged(io.RawIOBase):
    """A unit of a remote file as a store should send it: its own range (from the context before it) in one request,
    then the tail of its last document in small ones. Through fsspec's default read-ahead (5 MiB blocks over http)
    the store sent most units twice."""

    TAIL = 64 << 10

    def __init__(self, fs, path: str, start: int, end: int | None, base: int = 0, context: int = 0):
        self.fs, self.path, self.pos = fs, path, 0
        self.start = max(base, start - context)  # where the reader will seek: the unit's context before it
        self.end = end  # None: to the end of the file
        self.head = b""
        self.tail = None

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        assert whence == 0 and pos >= self.start and not self.head and self.tail is None, "seek once, to the start"
        self.pos = pos
        self.head = self.fs.cat_file(self.path, start=pos, end=self.end) if self.end is None or pos < self.end else b""
        self.base = pos
        return pos

    def read(self, n: int = -1) -> bytes:
        off = self.pos - self.base
        if off < len(self.head):
            data = self.head[off:off + n] if n >= 0 else self.head[off:]
        elif self.end is None:
            return b""
        else:
            if self.tail is None:
                self.tail = self.fs.open(self.path, "rb", block_size=self.TAIL, cache_type="readahead")
                self.tail.seek(self.pos)
            data = self.tail.read(min(n, self.TAIL) if n >= 0 else -1)
        self.pos += len(data)
        return data

    def close(self) -> None:
        if self.tail is not None:
            self.tail.close()
        super().close()
