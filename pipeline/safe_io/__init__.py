"""Safe I/O on storage other people share: one writer per output (lease.py), folders replaced all-or-nothing
(publish.py), transient faults of object stores retried (retry.py), names read from others' files confined to their
folder and sizes bounded (untrusted.py), and URLs stripped of their secrets wherever they leave the process
(redact.py)."""
