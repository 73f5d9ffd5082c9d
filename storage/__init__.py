"""The house's I/O. ``fs.py``: fsspec filesystems by URL (local, s3://, gs://, http(s)://), listing, atomic
writes, digests. Safe I/O on storage other people share: one writer per output (lease.py: the lease; its record,
lease_record.py; where it is kept, with conditional writes, lease_store.py; fence.py: how a job's writers prove it at
each commit), folders replaced all-or-nothing (publish.py), transient faults of object stores retried (retry.py),
names read from others' files confined to their folder and sizes bounded (untrusted.py), URLs stripped of their
secrets wherever they leave the process (redact.py), and no credential on a command line (argv.py)."""
