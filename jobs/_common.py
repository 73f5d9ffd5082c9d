"""What every job shares: logging set-up (configured once, here; library code only logs), with every URL in a log
line redacted (`storage.redact`: no userinfo, no signed or token query values), the --help format
(every default shown) and the flag types the jobs share."""
from __future__ import annotations

import argparse
import copy
import logging

from storage.argv import exposed_args_file, secret_in_argv
from storage.redact import install_log_redaction


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    install_log_redaction()


def refuse_secrets(parser: argparse.ArgumentParser, argv: list[str] | None) -> None:
    """Refuse (one line, exit 2) a command line holding a credential: storage/argv.py. The parsers read
    ``@FILE`` (one argument per line), where such URLs go instead; such a file readable by group or others is
    refused too, naming ``chmod 600``."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    message = secret_in_argv(args) or exposed_args_file(args)
    if message:  # argparse's error() would print the whole usage first: this is one line
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def refuse_bad_names(parser: argparse.ArgumentParser, parts: dict[str, str | None] | None = None,
                     outputs: dict[str, str | None] | None = None) -> None:
    """Refuse (one line, exit 2, before anything is written) a flag's path part (``parts``: a run name) or output
    folder (``outputs``) that would lead outside where it is meant to go: storage/names.py. None: not given."""
    import sys

    from storage.names import check_output, check_path_part

    try:
        for flag, value in (parts or {}).items():
            if value is not None:
                check_path_part(value, flag)
        for flag, value in (outputs or {}).items():
            if value is not None:
                check_output(value, flag)
    except ValueError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        sys.exit(2)


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """`--help` lists every default: "(default: X)" after each option that has one, also after options without help
    text (which argparse's ArgumentDefaultsHelpFormatter skips). An option whose default is None (chosen at run
    time, e.g. --lr by the model's size) says so in its own help; an on/off switch shows no "(default: False)". The
    description keeps its line breaks."""

    @staticmethod
    def shows_default(action: argparse.Action) -> bool:
        return bool(action.option_strings) and action.default not in (None, argparse.SUPPRESS) and not (
            action.nargs == 0 and action.default is False and not isinstance(action, argparse.BooleanOptionalAction))

    def _format_action(self, action: argparse.Action) -> str:
        if not action.help and self.shows_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or not self.shows_default(action):
            return text
        return f"{text} (default: %(default)s)"


def finite(minimum: float | None = None, maximum: float | None = None, *, above: float | None = None):
    """An argparse type: a finite number (no nan, inf) in range, checked where the flag is parsed so that the error
    names it (``argument --lr: 'nan': give a finite number > 0``). ``minimum``/``maximum`` inclusive, ``above``
    exclusive."""
    import math

    bounds = " and ".join(b for b in (f"> {above:g}" if above is not None else "",
                                      f">= {minimum:g}" if minimum is not None else "",
                                      f"<= {maximum:g}" if maximum is not None else "") if b)

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if (not math.isfinite(value) or (above is not None and value <= above)
                or (minimum is not None and value < minimum) or (maximum is not None and value > maximum)):
            raise argparse.ArgumentTypeError(f"{text!r}: give a finite number{' ' + bounds if bounds else ''}")
        return value

    parse.__name__ = "number"  # argparse names the type in its fallback message
    return parse


def comma_ints(text: str) -> tuple[int, ...]:
    """An argparse type: comma-separated integers ("32,64,96,128")."""
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. 32,64,96,128") from None


def workers(text: str) -> int | tuple[int, int]:
    """An argparse type: a number of workers, or MIN:MAX for an elastic run."""
    low, colon, high = text.partition(":")
    try:
        value = (int(low), int(high)) if colon else int(low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number of workers, or MIN:MAX (e.g. 2:8)") from None
    if min(value if colon else (value,)) < 1 or (colon and value[0] > value[1]):
        raise argparse.ArgumentTypeError(f"{text!r}: workers must be >= 1, and MIN <= MAX")
    return value


RAY_START_TIMEOUT = "The current node timed out during startup"  # Ray's words; workflows/execute.py retries on them


def ray_start_failed(error: BaseException) -> str | None:
    """One line for a local Ray that could not start (Ray's own exception is a 20-line traceback); None for any
    other error. It keeps Ray's words, which the workflow retries on, and says how loaded the machine is."""
    import os

    text = str(error)
    if RAY_START_TIMEOUT not in text and "Failed to start the GCS" not in text:
        return None
    cause = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    load = os.getloadavg()[0]
    return (f"a local Ray could not start: {cause[:200]} (load {load:.1f} on {os.cpu_count()} cores: an overloaded "
            "machine?); rerun the same command when it is quieter, or join a running Ray (RAY_ADDRESS)")


def run_main(main, job: str) -> None:
    """A job's ``__main__``: ``main()``'s exit code, a local Ray that could not start in one line (exit 1) rather
    than Ray's traceback, then ``exit_now``."""
    import sys

    try:
        code = main()
    except Exception as e:
        line = ray_start_failed(e)
        if line is None:
            raise
        print(f"{job}: error: {line}", file=sys.stderr, flush=True)
        code = 1
    exit_now(code)


def exit_now(code: int) -> None:
    """Exit once the job is done and its output flushed, with the exit handlers run (Ray's shutdown, MLflow's
    flush) but not the interpreter's teardown, where Ray's C++ threads and torch's can abort on a mutex (a SIGABRT
    dump after a finished job) and a loaded machine spends minutes collecting garbage nobody waits for."""
    import atexit
    import os
    import sys

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
