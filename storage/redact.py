"""URLs made safe to show: the one redaction applied wherever a URL leaves the process (log lines, MLflow params and
tags, manifests, checkpoints' train_state.json, exports' lineage, error messages). The full URL is used only to read.

What goes: the userinfo (`http://user:password@host` -> `http://REDACTED@host`: a user name alone can be a token,
as in `https://TOKEN@host`) and the value of every parameter that signs or authorises a request, after `?`, `&`, `;`
or `#` (S3 and GCS presigned URLs, Azure SAS, OAuth's `#access_token=` fragments, `;jsessionid=` path parameters,
anything named like a token, secret, password, signature, credential, session, JWT or key). The parameter names
stay, so a reader still sees that a URL was signed. In free text also: `name=value` for those names, an
environment-style `AWS_SECRET_ACCESS_KEY=...` (an upper-case name holding SECRET, TOKEN, PASSWORD, CREDENTIAL,
SESSION or ACCESS/PRIVATE/API_KEY) and the credentials of an `Authorization:` header.
"""
from __future__ import annotations

import logging
import re
import traceback
from typing import Any
from urllib.parse import urlsplit, urlunsplit

REDACTED = "REDACTED"

# Lower-cased parameter names whose values are secrets. AWS SigV4/SigV2 presigned URLs, GCS V4 signed URLs, Azure
# SAS tokens (`sig`; its other fields say what is allowed, not how to prove it), OAuth and generic API tokens.
SECRET_PARAMS = frozenset({
    "x-amz-signature", "x-amz-credential", "x-amz-security-token", "awsaccesskeyid", "signature",
    "x-goog-signature", "x-goog-credential", "googleaccessid",
    "sig", "token", "access_token", "id_token", "refresh_token", "auth", "authorization", "code",
    "key", "api_key", "apikey", "api-key", "password", "passwd", "pwd", "secret", "client_secret",
    "jwt", "session", "sessionid", "session_id", "jsessionid", "phpsessid", "access_key", "secret_key", "private_key",
})
_SECRET_WORDS = ("token", "secret", "password", "passwd", "signature", "credential", "apikey", "api_key", "api-key",
                 "jwt", "session", "access_key", "accesskey", "private_key", "secret_key")

# A scheme, "://", then everything up to whitespace or a character that ends a URL in prose, JSON or a repr.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def _secret_param(name: str) -> bool:
    low = name.lower()
    return low in SECRET_PARAMS or any(word in low for word in _SECRET_WORDS)


def redact_url(url: str) -> str:
    """`url` without its userinfo and with the values of its signing/token query parameters replaced."""
    if "://" not in url:
        return url
    try:
        parts = urlsplit(url)
    except ValueError:  # an unparseable URL (a bad port, a broken IPv6 literal): show nothing after the scheme
        return url.split("://", 1)[0] + "://" + REDACTED
    netloc = parts.netloc
    if "@" in netloc:
        netloc = REDACTED + "@" + netloc.rsplit("@", 1)[1]
        url = urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
    # Parameters after ? & ; # (the query, `;name=` path parameters, an OAuth fragment), their text kept as it was.
    return _PARAM.sub(_redact_param, url) if "=" in url else url


# A parameter after ? & ; or # (in a URL, or a file name a listing shows: `corpus.txt?X-Amz-Signature=...`).
# A parameter's value ends at the next parameter, a blank or a quote; punctuation right before those ends prose.
_PARAM = re.compile(r"([?&;#])([^=&?;#\s'\"<>`]+)=([^&?;#\s'\"<>`]*?)(?=[.,;:)\]}]*(?:[&?;#\s'\"<>`]|$))")
# `name=value` in prose for the exact secret names (`jwt=...`, `session=...`), after a blank or an opening mark.
_BARE = re.compile(r"(?i)(^|[\s(\[{'\"])(" + "|".join(re.escape(n) for n in sorted(SECRET_PARAMS, key=len,
                                                                                     reverse=True))
                   + r")=([^\s&;'\"<>`]+)")
# An environment-style assignment of a secret: AWS_SECRET_ACCESS_KEY=..., GITHUB_TOKEN=..., DB_PASSWORD=...
_ENV = re.compile(r"\b([A-Z][A-Z0-9_]*(?:SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|SESSION|ACCESS_KEY|PRIVATE_KEY|"
                  r"API_KEY)[A-Z0-9_]*)=([^\s'\"]+)")
# An Authorization header quoted in text: its scheme stays, its credentials go.
_AUTH = re.compile(r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)((?:basic|bearer|digest|token|negotiate|"
                   r"aws4-hmac-sha256|aws)\s+)?([^\s'\"][^'\"\n]*)")


def _redact_param(m: re.Match) -> str:
    return f"{m.group(1)}{m.group(2)}={REDACTED}" if _secret_param(m.group(2)) else m.group(0)


def _redact_match(m: re.Match) -> str:
    """A URL found in prose, its trailing punctuation (``URL: error``, ``URL.``) kept outside the redaction."""
    url = m.group(0)
    tail = len(url) - len(url.rstrip(".,;:)]}"))
    return redact_url(url[:len(url) - tail]) + url[len(url) - tail:] if tail else redact_url(url)


def redact_text(text: str) -> str:
    """`text` (a log line, an error message) with every URL in it redacted, and the values of signing/token query
    parameters wherever they appear (a bare file name from a listing carries its URL's query)."""
    if "://" in text:
        text = _URL.sub(_redact_match, text)
    if "=" in text:
        text = _PARAM.sub(_redact_param, text)
        text = _BARE.sub(lambda m: f"{m.group(1)}{m.group(2)}={REDACTED}", text)
        text = _ENV.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTH.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{REDACTED}", text)
    return text


def redact(value: Any) -> Any:
    """A copy of `value` (a config, params, a manifest: dicts, lists, tuples of plain values) with every string that
    holds a URL redacted; anything else unchanged."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value


class RedactingFilter(logging.Filter):
    """A logging filter that redacts URLs in every record's message and arguments, so no handler sees a secret
    (exceptions from storage libraries quote the URL they were given)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact_text(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact_text(a) if isinstance(a, str) else
                                redact_text(str(a)) if isinstance(a, BaseException) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: redact_text(v) if isinstance(v, str) else v for k, v in record.args.items()}
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = redact_text(logging.Formatter().formatException(record.exc_info))
        return True


def install_log_redaction(logger: logging.Logger | None = None) -> None:
    """Put a `RedactingFilter` on every handler of `logger` (the root logger by default): a filter on a handler sees
    records from every logger that propagates to it, a filter on a logger only its own."""
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        if not any(isinstance(f, RedactingFilter) for f in handler.filters):
            handler.addFilter(RedactingFilter())


def check_endpoint_url(endpoint_url: str) -> str:
    """`endpoint_url`, refused when it carries credentials: S3 clients sign requests with keys and cannot send a
    URL's userinfo (botocore rejects the bucket, s3fs the header, pyarrow the host name), so a password there would
    only ever reach logs."""
    if "@" in urlsplit(endpoint_url).netloc:
        raise ValueError(f"--endpoint-url {redact_url(endpoint_url)}: S3 clients cannot send credentials in the URL; "
                         "pass the host alone (http://HOST:PORT) and the keys as AWS_ACCESS_KEY_ID / "
                         "AWS_SECRET_ACCESS_KEY, an AWS profile or the node's role")
    return endpoint_url


def redact_exception(error: BaseException) -> BaseException:
    """`error` (and the exceptions it was raised from) with every URL in its string arguments redacted, in place, so
    that re-raising it keeps its type and traceback: for a process whose exceptions others print (a Ray worker's
    are written to Ray's session logs by Ray itself, not through our log handlers)."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        e.args = tuple(redact_text(a) if isinstance(a, str) else a for a in e.args)
        for name in ("strerror", "filename", "filename2", "msg"):  # what OSError and friends print instead of args
            if isinstance(value := getattr(e, name, None), str):
                try:
                    setattr(e, name, redact_text(value))
                except AttributeError:
                    pass
        e = e.__cause__ or e.__context__
    return error


class WorkerError(RuntimeError):
    """What a worker process raises in place of an unexpected exception: its type, message and traceback as text,
    every URL in them redacted. Ray writes a task's exception to its session logs and the driver's console itself,
    from the exception's own ``str`` (which for some libraries' errors is built from attributes, not ``args``:
    aiohttp's quotes the request URL with its query), so only a new exception made of redacted text is safe."""


def redacted_error(error: BaseException) -> WorkerError:
    text = "".join(traceback.format_exception(error)).rstrip()
    return WorkerError(redact_text(f"{type(error).__name__}: {error}\n{text}"))


_worker_logging = False


def redact_worker_logging() -> None:
    """In a worker process (Ray's): a root handler if there is none (else records go to logging's last-resort
    handler, which no filter reaches) and the redacting filter on every root handler. Idempotent and cheap."""
    global _worker_logging
    if _worker_logging:
        return
    root = logging.getLogger()
    if not root.handlers:  # what logging's last resort would print (WARNING and up, to stderr), filtered
        handler = logging.StreamHandler()
        handler.setLevel(logging.WARNING)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        root.addHandler(handler)
    install_log_redaction(root)
    _worker_logging = True
