"""No credential on a job's command line: every user of the machine reads a process's arguments (`ps`, /proc), and
`ray job submit` keeps the entrypoint in Ray's job table for the cluster's lifetime. A job refuses an argument that
holds one (what `redact.redact_text` would change: a URL's userinfo, a signed or token query parameter, an
environment-style secret) in one line that shows it redacted and says where it goes instead."""
from __future__ import annotations

import os
import stat

from storage.redact import redact_text

WHERE_CREDENTIALS_GO = (
    "pass S3 keys as AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (or an AWS profile, the node's role), an MLflow password"
    " as MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD, and a signed or password-bearing URL in a file only you"
    " can read, given as @FILE (its arguments one per line)")


def secret_in_argv(argv: list[str]) -> str | None:
    """The refusal for the first argument of ``argv`` that holds a credential (None when none does)."""
    for i, arg in enumerate(argv):
        if redact_text(arg) == arg:
            continue
        flag = argv[i - 1] if i and argv[i - 1].startswith("--") and "=" not in argv[i - 1] else None
        shown = f"{flag} {redact_text(arg)}" if flag else redact_text(arg)
        return (f"{shown}: a credential on the command line is readable by every user of this machine (ps) and kept"
                f" in Ray's job table; {WHERE_CREDENTIALS_GO}")
    return None


def exposed_args_file(argv: list[str]) -> str | None:
    """The refusal for the first ``@FILE`` of ``argv`` that holds a credential (what ``secret_in_argv`` would refuse
    on the command line) and that group or others may read (as ssh refuses a private key others can read); None
    when there is none. A file that cannot be read is left to the parser, which names it."""
    for arg in argv:
        if not arg.startswith("@") or len(arg) < 2:
            continue
        path = arg[1:]
        try:
            mode = os.stat(path).st_mode
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read(1 << 20).splitlines()
        except OSError:
            continue
        if mode & (stat.S_IRWXG | stat.S_IRWXO) and secret_in_argv(lines):
            return (f"{arg}: it holds a credential and is readable by other users of this machine (mode "
                    f"{stat.S_IMODE(mode):04o}); make it private: chmod 600 {path}")
    return None
