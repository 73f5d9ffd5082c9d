"""storage.redact: the one URL redaction, on the URLs users actually hand us, exact values."""
from __future__ import annotations

import io
import logging

import pytest

from storage.redact import REDACTED, install_log_redaction, redact, redact_text, redact_url

PRESIGNED = ("https://bucket.s3.amazonaws.com/corpus/part-0.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
             "&X-Amz-Credential=AKIACANARY%2F20261126%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20261126T010000Z"
             "&X-Amz-Expires=3600&X-Amz-SignedHeaders=host&X-Amz-Security-Token=CANARYTOKEN"
             "&X-Amz-Signature=CANARYSIG")


def test_userinfo_goes_host_port_and_path_stay():
    assert redact_url("http://user:CANARYPW@127.0.0.1:9000/b/k") == f"http://{REDACTED}@127.0.0.1:9000/b/k"
    assert redact_url("https://CANARYTOKEN@example.com/x") == f"https://{REDACTED}@example.com/x"
    # '@' in the password itself (only the last '@' ends the userinfo)
    assert redact_url("http://u:p@ss@host/c") == f"http://{REDACTED}@host/c"


def test_signed_and_token_parameters_lose_their_values_and_keep_their_names():
    out = redact_url(PRESIGNED)
    assert "CANARY" not in out
    assert out.startswith("https://bucket.s3.amazonaws.com/corpus/part-0.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256&")
    assert f"X-Amz-Signature={REDACTED}" in out and f"X-Amz-Credential={REDACTED}" in out
    assert "X-Amz-Expires=3600" in out  # not a secret: kept
    assert redact_url("https://acct.blob.core.windows.net/c/f.txt?sv=2024-01-01&sp=r&sig=CANARY%2B%3D") == \
        f"https://acct.blob.core.windows.net/c/f.txt?sv=2024-01-01&sp=r&sig={REDACTED}"
    assert redact_url("http://h/f?access_token=C1&page=2&MyApiToken=C2") == \
        f"http://h/f?access_token={REDACTED}&page=2&MyApiToken={REDACTED}"


def test_what_holds_no_secret_is_returned_unchanged():
    for url in ("s3://bucket/datasets/wiki-128", "/mnt/shared/exports/x", "file:///tmp/a b", "http://h:8/f?page=2",
                "gs://b/o?generation=3"):
        assert redact_url(url) == url


def test_an_unparseable_url_shows_nothing_after_its_scheme():
    assert redact_url("http://u:CANARY@[::1/x") == f"http://{REDACTED}"


def test_a_bare_query_in_text_loses_its_secret_values():
    assert redact_text("holds only corpus.txt?X-Amz-Signature=CANARY&X-Amz-Expires=60, a.md") == \
        f"holds only corpus.txt?X-Amz-Signature={REDACTED}&X-Amz-Expires=60, a.md"
    assert redact_text("a=b and x?page=2") == "a=b and x?page=2"


def test_text_and_nested_values():
    text = f"could not read http://u:CANARY1@127.0.0.1:8000/corpus.txt ('{PRESIGNED}'): 403"
    out = redact_text(text)
    assert "CANARY" not in out and out.startswith(f"could not read http://{REDACTED}@127.0.0.1:8000/corpus.txt ('")
    assert out.endswith("'): 403")
    config = {"inputs": ["http://u:CANARY@h/c.txt", "s3://b/k"], "endpoint_url": "http://a:CANARY@127.0.0.1:1",
              "steps": 3, "nested": ({"url": PRESIGNED},), "none": None}
    clean = redact(config)
    assert "CANARY" not in repr(clean)
    assert clean["inputs"][1] == "s3://b/k" and clean["steps"] == 3 and clean["none"] is None
    assert isinstance(clean["nested"], tuple)
    assert "CANARY" in repr(config)  # a copy: the original is what reads


def test_log_records_are_redacted_in_message_arguments_and_tracebacks():
    stream = io.StringIO()
    logger = logging.getLogger("test_redact_probe")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    install_log_redaction(logger)
    try:
        logger.warning("reading %s", "http://u:CANARY1@127.0.0.1:1/c.txt")
        logger.warning("fetched http://x:CANARY2@h/f and %(u)s", {"u": "http://h/f?token=CANARY3"})
        try:
            raise OSError("Cannot connect to http://u:CANARY4@127.0.0.1:1/b")
        except OSError as e:
            logger.exception("failed: %s", e)
    finally:
        logger.removeHandler(handler)
    out = stream.getvalue()
    assert "CANARY" not in out
    assert out.count(REDACTED) >= 5 and "Traceback" in out


def test_an_endpoint_with_credentials_is_refused_without_showing_them():
    import pytest

    from storage.fs import filesystem_for
    from storage.redact import check_endpoint_url

    assert check_endpoint_url("http://127.0.0.1:9000") == "http://127.0.0.1:9000"
    with pytest.raises(ValueError, match=r"--endpoint-url http://REDACTED@127.0.0.1:9000: S3 clients cannot") as e:
        filesystem_for("s3://bucket/key", "http://user:CANARYPW@127.0.0.1:9000")
    assert "CANARY" not in str(e.value)


def test_an_exception_and_its_causes_are_redacted_in_place():
    from storage.redact import redact_exception

    try:
        try:
            raise OSError(2, "cannot open http://u:CANARY1@h/c.txt?sig=CANARY2")
        except OSError as inner:
            raise ValueError("reading http://h/f?token=CANARY3 failed", 7) from inner
    except ValueError as caught:
        e, same = caught, redact_exception(caught)
    assert same is e and type(e) is ValueError and e.args[1] == 7 and e.__traceback__ is not None
    assert "CANARY" not in str(e) + str(e.__cause__) and e.__cause__.errno == 2


def test_a_task_error_leaves_the_worker_redacted_and_a_users_mistake_as_it_is():
    """What a Ray task of the build raises (pipeline/ray_data/guard.py): an exception whose message is built
    from its attributes (as aiohttp's is, from the request URL) becomes a WorkerError of redacted text, its
    traceback included; a user's mistake stays itself, to be carried back as a value."""
    from corpus.readers import InputError
    from pipeline.ray_data.guard import guarded, in_worker
    from storage.redact import WorkerError

    class ResponseError(Exception):  # like aiohttp.ClientResponseError: str() from attributes, args empty
        url = "http://127.0.0.1:9/c.txt?X-Amz-Signature=SECRETSIG"

        def __str__(self) -> str:
            return f"500, message='boom', url='{self.url}'"

    def fails():
        raise ResponseError()

    with pytest.raises(WorkerError) as caught:
        in_worker(fails)
    text = str(caught.value)
    assert "SECRETSIG" not in text and "X-Amz-Signature=REDACTED" in text
    assert text.startswith("ResponseError: 500") and "in fails" in text  # the type and the traceback survive

    def mistake(_):
        raise InputError("input http://u:p@h/c.txt: bad json [bad_json]")

    op = guarded(type("SplitTokenize", (), {"__call__": lambda self, x: mistake(x)})())
    assert type(op).__name__ == "SplitTokenize"  # Ray's plans name the operator, not the guard
    with pytest.raises(InputError):
        op(1)


def test_the_forms_the_audit_found_in_free_text():
    """Issue 30, item 14: secrets after `;` and `#`, under the names jwt/session/access_key, an Authorization header and
    an environment-style assignment, wherever they appear in a line."""
    cases = {
        "GET http://h/app;jsessionid=CANARY1?page=2": f"GET http://h/app;jsessionid={REDACTED}?page=2",
        "see http://h/x?a=1;token=CANARY2 now": f"see http://h/x?a=1;token={REDACTED} now",
        "redirect to https://h/cb#access_token=CANARY3&state=ok": f"redirect to https://h/cb#access_token={REDACTED}&state=ok",
        "cookie jwt=CANARY4; session=CANARY5": f"cookie jwt={REDACTED}; session={REDACTED}",
        "args access_key=CANARY6 region=eu": f"args access_key={REDACTED} region=eu",
        "header Authorization: Basic Q0FOQVJZNzpwdw==": f"header Authorization: Basic {REDACTED}",
        "{'Authorization': 'Bearer CANARY8'}": f"{{'Authorization': 'Bearer {REDACTED}'}}",
        "env AWS_SECRET_ACCESS_KEY=CANARY9 AWS_DEFAULT_REGION=us-east-1":
            f"env AWS_SECRET_ACCESS_KEY={REDACTED} AWS_DEFAULT_REGION=us-east-1",
    }
    for text, expected in cases.items():
        assert redact_text(text) == expected, text
    assert redact_url("https://h/cb#access_token=CANARY&x=1") == f"https://h/cb#access_token={REDACTED}&x=1"
    # What is not a secret stays: metrics in progress lines, plain key=value, an Authorization without credentials.
    line = "step 40/400 tokens_per_second=3280 loss=6.99 session_count=2"
    assert redact_text(line) == line
