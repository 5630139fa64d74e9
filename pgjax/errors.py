"""Errors from a user's code, said in one line: where in the user's code an exception arose
(``raised_at``), what it says (``error_text``), both (``located_error``, ``raised_text``), and a value
shown by its type (``described_value``). Every message that reports an exception from a user's
module, task, reward function, tool, sink or model family is built from these. ``RunStopped``: the
error that stops a run that cannot go on.
"""
from __future__ import annotations

import os
import pathlib
import sysconfig
import traceback

# where a user's code is not: this package, the standard library and installed packages
_LIBRARIES = tuple(dict.fromkeys([str(pathlib.Path(__file__).resolve().parent) + os.sep,
                                  *(sysconfig.get_path(p) + os.sep for p in ("stdlib", "platstdlib", "purelib",
                                                                              "platlib"))]))


def raised_at(error: BaseException) -> str:
    """``file:line`` in the user's code where ``error`` arose: a SyntaxError's own file and line, else
    the innermost traceback frame outside pgjax, the standard library and installed packages; empty
    when there is none. The file is shown relative to the working directory when it lies below it."""
    if isinstance(error, SyntaxError) and error.filename:
        filename, line = error.filename, error.lineno
    else:
        frames = [f for f in traceback.extract_tb(error.__traceback__)
                  if not f.filename.startswith("<") and not os.path.abspath(f.filename).startswith(_LIBRARIES)]
        if not frames:
            return ""
        filename, line = frames[-1].filename, frames[-1].lineno
    path = os.path.abspath(filename)
    relative = os.path.relpath(path)
    return f"{path if relative.startswith('..') else relative}:{line}"


def error_text(error: BaseException) -> str:
    """``Type: message`` of ``error`` on one line (a SyntaxError's message without its location)."""
    message = error.msg if isinstance(error, SyntaxError) else str(error)
    message = " ".join(str(message).split())
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def located_error(error: BaseException) -> str:
    """``file:line: Type: message``, where in the user's code ``error`` arose (``raised_at``) and what it
    says: the one line that reports an exception from a user's module, task or reward function."""
    where = raised_at(error)
    return f"{where}: {error_text(error)}" if where else error_text(error)


def raised_text(error: BaseException) -> str:
    """``Type: message (file:line)``: what ``error`` says, then where in the user's code it arose
    (``raised_at``; nothing where that is not known), for a message naming who raised it."""
    where = raised_at(error)
    return f"{error_text(error)} ({where})" if where else error_text(error)


def described_value(value) -> str:
    """``None``, or ``a str ('1.0')``: a value's type and its (shortened) repr, for a message."""
    if value is None:
        return "None"
    kind, text = type(value).__name__, repr(value)
    return f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} ({text if len(text) <= 40 else text[:37] + '...'})"


class RunStopped(RuntimeError):
    """Training cannot go on: a reward function that failed (raised, did not return within
    ``task.reward.timeout``, returned something that is not one number per completion, or a NaN or
    infinity), repeated non-finite updates, or a non-finite state about to be saved. Nothing non-finite
    was written; the last checkpoint is intact."""
