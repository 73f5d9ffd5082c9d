"""What every job shares: logging set-up (configured once, here; library code only logs), with every URL in a log
line redacted (`pipeline.safe_io.redact`: no userinfo, no signed or token query values)."""
from __future__ import annotations

import logging

from pipeline.safe_io.redact import install_log_redaction


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    install_log_redaction()
