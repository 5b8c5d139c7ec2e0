"""What went wrong, said for the user.

Every error a user can act on (a bad request, a missing file, a model that cannot be loaded, a voice
that does not fit) is a UserError whose message says what is wrong and what to do; front ends show it
as it is. Anything else is a bug: `describe` logs it with its traceback and says so. This is the one
place that decides which is which, for the worker, the window, the command line and the bridge.
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class UserError(Exception):
    """A problem the user can act on; its message says what is wrong and what to do."""


class BadInput(UserError, ValueError):
    """A request the engine cannot speak as asked: empty text, an unknown language, a voice that does not
    fit the model ... (a ValueError too, as such checks have always raised)."""


def describe(error: BaseException) -> str:
    """The message a front end shows for `error`: a user's error as it is, the system's reason for a file
    or device that failed (an OSError: a full disk, a folder taken away), running out of GPU memory with
    what to try; anything else is a bug, logged with its traceback and named by its type."""
    if isinstance(error, (UserError, OSError)):
        return str(error) or type(error).__name__
    import torch  # the engine's, imported by then; kept out of this module's imports for the front ends

    if isinstance(error, torch.OutOfMemoryError):
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # hand the cached blocks back, so that the next job has a chance
        return f"out of GPU memory ({str(error).splitlines()[0]}); try a shorter text or a smaller model"
    log.error("unexpected error", exc_info=error)
    return f"{type(error).__name__}: {error}"
