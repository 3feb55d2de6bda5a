"""How a command reports a failure: one line, an exit status, and the traceback only on request.

A user error (a missing or unsupported model, a bad value, no GPU) exits with status 2; anything else
is a bug or an environment fault and exits with status 1. CRUCIBLE_DEBUG=1 adds the traceback.
"""

from __future__ import annotations

import os
import sys
import traceback

from crucible.core.devices import NoGPUError

DEBUG_ENV = "CRUCIBLE_DEBUG"


class UnsupportedModelError(ValueError):
    """The model's architecture, tensor type or feature is outside what Crucible supports."""


USER_ERROR, INTERNAL_ERROR = 2, 1


def debug() -> bool:
    """Whether CRUCIBLE_DEBUG asks for tracebacks."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def exit_status(exc: BaseException) -> int:
    """2 for what the user can fix (model, file, value, device), 1 for everything else."""
    # UnsupportedModelError and SamplingError are ValueErrors; ModelNotFoundError is a FileNotFoundError.
    return USER_ERROR if isinstance(exc, (ValueError, FileNotFoundError, NoGPUError)) else INTERNAL_ERROR


def one_line(exc: BaseException) -> str:
    """The exception's message on one line (its first line when it has several)."""
    text = str(exc).strip() or type(exc).__name__
    lines = text.splitlines()
    return lines[0] + (" ..." if len(lines) > 1 else "")


def debug_hint(status: int) -> str:
    """What a non-user error's line ends with: a pointer to CRUCIBLE_DEBUG ("" where it would not help)."""
    return "" if status == USER_ERROR or debug() else f" ({DEBUG_ENV}=1 shows the traceback)"


def report(prog: str, exc: BaseException, what: str = "") -> int:
    """Prints `prog: error: [what: ]message` (plus the traceback under CRUCIBLE_DEBUG) to stderr.

    Args:
        prog: The command, e.g. "crucible generate".
        exc: What failed.
        what: What was being done, e.g. "cannot load model 'x'".

    Returns:
        The exit status for it.
    """
    status = exit_status(exc)
    if debug():
        traceback.print_exception(exc, file=sys.stderr)
    kind = "" if status == USER_ERROR else f"{type(exc).__name__}: "
    prefix = f"{what}: " if what else ""
    print(f"{prog}: error: {prefix}{kind}{one_line(exc)}{debug_hint(status)}", file=sys.stderr, flush=True)
    return status
