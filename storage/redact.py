"""URLs made safe to show: the one redaction applied wherever a URL leaves the process (log lines, MLflow params and
tags, manifests, checkpoints' train_state.json, exports' lineage, error messages). The full URL is used only to read.

What goes: the userinfo (`http://user:password@host` -> `http://REDACTED@host`: a user name alone can be a token,
as in `https://TOKEN@host`) and the value of every parameter that signs or authorises a request, after `?`, `&`, `;`
or `#` (S3 and GCS presigned URLs, Azure SAS, OAuth's `#access_token=` fragments, `;jsessionid=` path parameters,
anything named like a token, secret, password, signature, credential, session, JWT or key). The parameter names
stay, so a reader still sees that a URL was signed. In free text also: `name=value` for those names, an
environment-style `AWS_SECRET_ACCESS_KEY=...` (an upper-case name holding SECRET, TOKEN, PASSWORD, CREDENTIAL,
SESSION or ACCESS/PRIVATE/API_KEY) and the credentials of an `Authorization:` header.

Spellings a server decodes are matched decoded: percent-encoding (`?%74oken=X`, `token%3DX`, twice-encoded
`%2574oken`) and `+` for a blank in a parameter's name (`?api+key=X`) are undone before matching, and a text with
a secret behind them is shown decoded, the secret replaced. Also caught: a secret as a path segment after a
segment that names one (`/api/token/X/`), a flag's value (`--password=X`), and tokens known by their prefix,
wherever they stand (Hugging Face `hf_`, GitHub `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_`/`github_pat_`, Slack
`xoxb-`/`xoxp-`, AWS key ids `AKIA`/`ASIA`, GitLab `glpat-`, a JWT `eyJ...`, `Bearer X`). The argv refusal
(storage/argv.py) asks this same matcher.
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
    "pass", "passphrase", "pw", "credentials", "creds",
})
_SECRET_WORDS = ("token", "secret", "password", "passwd", "signature", "credential", "apikey", "api_key", "api-key",
                 "jwt", "session", "access_key", "accesskey", "private_key", "secret_key")

# A scheme, "://", then everything up to whitespace or a character that ends a URL in prose, JSON or a repr.
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>`]+")


def _secret_param(name: str) -> bool:
    low = _decode(name).lower()
    norm = re.sub(r"[\s+.-]+", "_", low)  # `api key`, `api+key`, `api.key` name what `api_key` does
    return (low in SECRET_PARAMS or norm in SECRET_PARAMS or norm.replace("_", "-") in SECRET_PARAMS
            or any(word in low or word in norm for word in _SECRET_WORDS))


_PERCENT = re.compile(r"%([0-9A-Fa-f]{2})")


def _decode(text: str, rounds: int = 4) -> str:
    """``text`` with its percent-encoding undone (again, for a twice-encoded ``%2574``), ``+`` kept: what a server
    matches a parameter's name against. Malformed escapes stay as they are."""
    for _ in range(rounds):
        if "%" not in text:
            break
        decoded = _PERCENT.sub(lambda m: chr(int(m.group(1), 16)), text)
        if decoded == text:
            break
        text = decoded
    return text


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
# (`pass` and `pw` are too common as words in prose to be taken there: in a URL's query they are.)
_BARE = re.compile(r"(?i)(^|[\s(\[{'\"])(" + "|".join(re.escape(n) for n in sorted(SECRET_PARAMS - {"pass", "pw"},
                                                                                     key=len, reverse=True))
                   + r")=([^\s&;'\"<>`]+)")
# A command-line flag that carries a secret as its value: --password=X, --hf-token=X, --api-key X is argv's own.
_FLAG = re.compile(r"(?i)(^|[\s(\[{'\"])(--?[a-z0-9_-]*(?:password|passwd|passphrase|token|secret|api[_-]?key|"
                   r"credential|signature)[a-z0-9_-]*)=(?!" + REDACTED + r"(?:\s|$))(\S+)")
# An environment-style assignment of a secret: AWS_SECRET_ACCESS_KEY=..., GITHUB_TOKEN=..., DB_PASSWORD=...
_ENV = re.compile(r"\b([A-Z][A-Z0-9_]*(?:SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|SESSION|ACCESS_KEY|PRIVATE_KEY|"
                  r"API_KEY)[A-Z0-9_]*)=([^\s'\"]+)")
# An Authorization header quoted in text: its scheme stays, its credentials go.
# A path segment that names a secret, then the secret: /api/token/X/, /auth/secret/X
_SEGMENT = re.compile(r"(?i)(/(?:token|secret|password|passwd|api[_-]?key|access[_-]?token|auth[_-]?token)/)"
                      r"(?!" + REDACTED + r"(?:[/?#\s'\"<>`]|$))([^/?#\s'\"<>`]+)")
# Tokens known by their prefix, wherever they stand; the prefix stays so a reader sees what kind it was.
# Each with its real length, so that names such as `hf_hub_download` or `ASIAN_LANGUAGES` stay as they are.
_PREFIXED = re.compile(r"(?<![A-Za-z0-9])(?:(hf_|gh[pousr]_)(?!" + REDACTED + r")[A-Za-z0-9]{30,}"
                       r"|(github_pat_|glpat-|sk-)(?!" + REDACTED + r")[A-Za-z0-9_-]{20,}"
                       r"|(xox[abposr]-)(?!" + REDACTED + r")[A-Za-z0-9-]{10,}"
                       r"|(AKIA|ASIA)(?!" + REDACTED + r")[A-Z0-9]{16}(?![A-Za-z0-9]))")
# `Bearer X` without its header name, and a JWT (three base64url parts, the first `eyJ`: '{"') anywhere.
_BEARER = re.compile(r"(?i)(\bbearer\s+|(?<![A-Za-z0-9_-])(?=eyJ))(?!" + REDACTED + r")([A-Za-z0-9._~+/=-]{8,})")
_AUTH = re.compile(r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)((?:basic|bearer|digest|token|negotiate|"
                   r"aws4-hmac-sha256|aws)\s+)?([^\s'\"][^'\"\n]*)")


def _redact_param(m: re.Match) -> str:
    return f"{m.group(1)}{m.group(2)}={REDACTED}" if _secret_param(m.group(2)) else m.group(0)


def _redact_match(m: re.Match) -> str:
    """A URL found in prose, its trailing punctuation (``URL: error``, ``URL.``) kept outside the redaction."""
    url = m.group(0)
    tail = len(url) - len(url.rstrip(".,;:)]}"))
    return redact_url(url[:len(url) - tail]) + url[len(url) - tail:] if tail else redact_url(url)


def _redact_plain(text: str) -> str:
    if "://" in text:
        text = _URL.sub(_redact_match, text)
    if "=" in text:
        text = _PARAM.sub(_redact_param, text)
        text = _BARE.sub(lambda m: f"{m.group(1)}{m.group(2)}={REDACTED}", text)
        text = _FLAG.sub(lambda m: f"{m.group(1)}{m.group(2)}={REDACTED}", text)
        text = _ENV.sub(lambda m: f"{m.group(1)}={REDACTED}", text)
    if "uthorization" in text or "UTHORIZATION" in text:
        text = _AUTH.sub(lambda m: f"{m.group(1)}{m.group(2) or ''}{REDACTED}", text)
    if "/" in text:
        text = _SEGMENT.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    text = _PREFIXED.sub(lambda m: f"{next(g for g in m.groups() if g)}{REDACTED}", text)
    return _BEARER.sub(lambda m: f"{m.group(1)}{REDACTED}", text)


def redact_text(text: str) -> str:
    """`text` (a log line, an error message) with every URL in it redacted, and the values of signing/token query
    parameters wherever they appear (a bare file name from a listing carries its URL's query). A text whose
    percent-encoding hides a secret (``?%74oken=X``, ``token%3DX``) comes back decoded, the secret replaced."""
    if "%" in text:
        decoded = _decode(text)
        shown = _redact_plain(decoded)
        if shown != decoded:
            return shown
    return _redact_plain(text)


def redact(value: Any) -> Any:
    """A copy of `value` (a config, params, a manifest: dicts, lists, tuples of plain values) with every string that
    holds a URL redacted, dict keys included; anything else unchanged."""
    if isinstance(value, str):
        return redact_text(value)
    if isinstance(value, dict):  # keys too: a manifest's statistics are keyed by source URL
        return {redact_text(k) if isinstance(k, str) else k: redact(v) for k, v in value.items()}
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
