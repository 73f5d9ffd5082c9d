"""`--init` from anywhere: a model directory at a URL (s3://, gs://, any fsspec URL) fetched into a local cache, so
stages on a cluster hand weights over through object storage instead of a shared volume.

What is fetched: one of our exports (`export.json` at the URL: the complete version it points at, see
storage/publish.py; a URL with export versions but no pointer, an interrupted first export, is refused),
an HF BERT directory (`config.json` at the URL: its files, not its subfolders), or a pre-training checkpoint
(`model/config.json`: only `model/`, not the optimizer state beside it). File names come from a listing or the
pointer, both written by others: each must stay inside the model's folder; sizes are bounded (MAX_FILE_BYTES). The
cache lives under the job's output or work directory (never /tmp), one folder per URL and remote version (names,
sizes and etags of the files), written under a temporary name and renamed into place: a folder found there is
complete, a model changed at the URL is fetched again, an unchanged one is not. Local paths pass through untouched.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import shutil
import tempfile
from pathlib import Path

from storage.fs import filesystem_for, is_url, storage_error
from storage.publish import resolve
from storage.redact import redact_url
from storage.retry import retrying
from storage.untrusted import check_relative_name

log = logging.getLogger(__name__)

MANIFEST = ".fetched.json"
# The largest file of a model we fetch: bert-large's weights in float32 are 1.3 GB; a file beyond this was not
# written by our exports and would only fill the disk.
MAX_FILE_BYTES = 8 << 30


def local_model_dir(init: str, cache_dir: str | os.PathLike | None, endpoint_url: str | None = None) -> Path:
    """The local directory holding ``init``'s config.json and weights (a checkpoint's ``model/``): a URL is fetched
    into ``cache_dir`` first, once per machine and version of the model there. What the jobs and the workers call;
    configs only name the model."""
    from bert_core.hf import resolve_model_dir

    return resolve_model_dir(fetch_model(init, cache_dir or ".", endpoint_url))


def fetch_model(url: str, cache_dir: str | os.PathLike, endpoint_url: str | None = None) -> Path:
    """The local directory of the model at `url` (fetched into `cache_dir` when it is a URL)."""
    if not is_url(url):
        return Path(url.removeprefix("file://"))
    try:
        fs, root = filesystem_for(url, endpoint_url)
        fs.invalidate_cache()
        published = resolve(url, endpoint_url)
        if published is not None:  # our export: the version its pointer names, nothing else
            root = filesystem_for(published[0], endpoint_url)[1]
        listing = retrying(lambda: fs.find(root, detail=True), f"list {url}")
    except ValueError:
        raise
    except Exception as e:  # noqa: BLE001 (each filesystem raises its own types: name the URL and the fix)
        raise storage_error(url, e, "list the model at") from e
    files = {posixpath.relpath(path, root): info for path, info in listing.items() if info.get("type") != "directory"}
    if published is not None:
        missing = sorted(set(published[1]) - set(files))
        if missing:
            raise ValueError(f"--init {redact_url(url)}: its export.json names {', '.join(missing[:3])}, missing from "
                             f"{published[0]}; export to it again")
        files = {k: v for k, v in files.items() if k in published[1]}
    for name, info in files.items():
        check_relative_name(name, redact_url(url), "file")
        if int(info.get("size") or 0) > MAX_FILE_BYTES:
            raise ValueError(f"--init {redact_url(url)}: {name} is {info.get('size')} bytes, more than {MAX_FILE_BYTES}"
                             " (a BERT far larger than bert-large): refusing to fetch it")
    if "config.json" in files:
        wanted = {k: v for k, v in files.items() if "/" not in k}
    elif "model/config.json" in files:
        wanted = {k: v for k, v in files.items() if k.startswith("model/")}
    else:
        raise ValueError(f"--init {redact_url(url)}: no model there (found {len(files)} files, none of them "
                         "config.json or model/config.json); pass an export, a checkpoint or a Hugging Face BERT "
                         "directory")
    version = sorted((k, int(v.get("size") or 0), _version(v)) for k, v in wanted.items())
    key = hashlib.sha256(json.dumps([url, version]).encode()).hexdigest()[:16]
    cache = Path(cache_dir)
    target = cache / key
    if (target / MANIFEST).is_file():
        log.info("--init %s: using the copy fetched before, %s", redact_url(url), target)
        return target
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".fetching-", dir=cache))
    try:
        for name in wanted:
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            retrying(lambda name=name: fs.get_file(posixpath.join(root, name), str(tmp / name)),
                     f"fetch {name} of {redact_url(url)}")
        (tmp / MANIFEST).write_text(json.dumps({"url": redact_url(url), "files": version}, indent=1) + "\n")
        if target.exists():  # another process fetched the same version meanwhile: keep theirs
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, target)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, Exception) and not isinstance(e, ValueError):
            raise storage_error(url, e, "fetch the model at") from e
        raise
    log.info("--init %s: fetched %d files (%.1f MB) into %s", redact_url(url), len(wanted),
             sum(v for _, v, _ in version) / 1e6, target)
    return target


def _version(info: dict) -> str:
    """What changes when a file is rewritten: its etag on object stores, else its modification time."""
    for key in ("ETag", "etag", "md5Hash", "generation", "LastModified", "mtime", "updated"):
        if info.get(key) is not None:
            return str(info[key]).strip('"')
    return ""
