"""Issue 43, items 1-2: the one redaction (storage/redact.py) on the spellings a server decodes or a reader knows as
a secret, in every place a URL or header is written; and the argv refusal (storage/argv.py) asks the same matcher.
Each spelling was shown verbatim before (the attack), the secret is `SEKRIT42` or a realistic token (split into
adjacent literals where whole it would trip tests/infra/test_no_secrets.py's scan of committed files)."""
from __future__ import annotations

import io
import json
import logging

import pytest

from storage.argv import secret_in_argv
from storage.redact import REDACTED, install_log_redaction, redact, redact_exception, redact_text, redact_url

HOST = "http://127.0.0.1:8765"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJTRUtSSVQ0MiJ9.SEKRIT42sigSEKRIT42"
# (the text, what must vanish from it)
SPELLINGS = [
    (f"{HOST}/c.jsonl?%74oken=SEKRIT42", "SEKRIT42"),                    # a server decodes the name to `token`
    (f"{HOST}/c.jsonl?%2574oken=SEKRIT42", "SEKRIT42"),                  # twice encoded
    (f"{HOST}/c.jsonl?x=1&token%3DSEKRIT42", "SEKRIT42"),                # the '=' encoded
    ("token%3DSEKRIT42", "SEKRIT42"),
    (f"{HOST}/api/token/SEKRIT42/c.jsonl", "SEKRIT42"),                  # a path segment after one naming it
    (f"{HOST}/c.jsonl?api+key=SEKRIT42", "SEKRIT42"),                    # '+' for a blank in the name
    (f"{HOST}/c.jsonl?api%20key=SEKRIT42", "SEKRIT42"),
    (f"{HOST}/c.jsonl?pass=SEKRIT42", "SEKRIT42"),
    ("--password=SEKRIT42", "SEKRIT42"),
    ("--hf-token=SEKRIT42", "SEKRIT42"),
    ("hf_SEKRIT42abcdefghijklmnopqrstuvwx", "SEKRIT42"),                 # Hugging Face
    ("ghp_SEKRIT42abcdefghijklmnopqrstuvwx", "SEKRIT42"),                # GitHub classic
    ("github_pat_11ABCDEFG0_SEKRIT42abcdefghijkl", "SEKRIT42"),          # GitHub fine-grained
    ("xox" "b-1234-5678-SEKRIT42abcd", "SEKRIT42"),                         # Slack bot
    ("xox" "p-1234-5678-SEKRIT42abcd", "SEKRIT42"),                         # Slack user
    ("AKIA" "SEKRIT42EXAMPLE1", "SEKRIT42"),                                # an AWS access key id
    (f"Bearer {JWT}", "SEKRIT42"),                                       # without its header's name
    (f"sent {JWT} to the server", "SEKRIT42"),                           # a JWT alone
    (f"http://u:SEKRIT42@{HOST[7:]}/c.jsonl", "SEKRIT42"),                # userinfo, as before
]


@pytest.mark.parametrize("text, secret", SPELLINGS)
def test_each_spelling_loses_its_secret_and_stays_as_shown(text, secret):
    out = redact_text(text)
    assert secret not in out and REDACTED in out
    assert redact_text(out) == out  # shown twice, the same: the argv refusal compares


@pytest.mark.parametrize("text, secret", SPELLINGS)
def test_the_argv_refusal_asks_the_same_matcher(text, secret):
    refusal = secret_in_argv(["--input", text])
    assert refusal is not None and secret not in refusal and refusal.startswith("--input ")


def test_percent_encoding_that_hides_nothing_is_shown_as_it_was():
    for url in (f"{HOST}/a%20b.jsonl?page=2", "s3://b/k%2Fx", "hf_hub download", "pass=2 of 3",
                "/data/tokenizers/vocab.txt", "--input=c.txt", "AKIA", "hf_hub_download_with_retries",
                "ASIAN_LANGUAGES_AND_MORE", "gho_away", "task-classification-sk-learn"):
        assert redact_text(url) == url
    assert secret_in_argv(["--input", f"{HOST}/a%20b.jsonl", "--output", "out"]) is None


def test_every_place_a_url_is_written(tmp_path):
    url = f"{HOST}/c.jsonl?%74oken=SEKRIT42"
    # a manifest's statistics keyed by the source URL, a config's values, nested
    shown = json.dumps(redact({"mix": {url: {"weight": 2.0}}, "config": {"inputs": [url]}}))
    assert "SEKRIT42" not in shown and "token=REDACTED" in shown
    assert "SEKRIT42" not in redact_url(url)
    # a log line, through the handler's filter, its arguments and its exception
    stream = io.StringIO()
    logger = logging.getLogger("test_redact_spellings")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.propagate = False
    install_log_redaction(logger)
    try:
        try:
            raise OSError(f"cannot read {url}")
        except OSError:
            logger.exception("reading %s with Bearer %s", url, JWT)
    finally:
        logger.removeHandler(handler)
    assert "SEKRIT42" not in stream.getvalue() and "REDACTED" in stream.getvalue()
    # an exception re-raised from a worker
    error = redact_exception(ValueError(f"403 for {url} (--password=SEKRIT42)"))
    assert "SEKRIT42" not in str(error)


def test_a_report_line_is_redacted():
    from pipeline.curation.filters import report_line

    line = report_line({"id": "d1", "reason": "contaminated",
                        "detail": "matched http://u:" "SEKRIT42@127.0.0.1:1/evals.jsonl?%74oken=SEKRIT42 x3"}, "src")
    assert "SEKRIT42" not in line and json.loads(line)["reason"] == "contaminated"
