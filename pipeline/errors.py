"""The one exception type for a user's mistakes: ``pipeline.CnsbenchError``.

The Python API (``pipeline.open_output``, ``pipeline.evaluate``, ...) raises it for bad
input: a config, a path, a model, a weight file.  Its message is the one the command line
prints for the same input (``cnsbench CMD: error: MESSAGE``, exit 2).  It derives from
``ValueError`` so code that already catches a bad value keeps catching it.
"""

from __future__ import annotations


class CnsbenchError(ValueError):
    """Bad input to cnsbench; the message names what was wrong and where."""


def describe_os_error(err: OSError) -> str:
    """``[Errno 21] Is a directory: 'x'`` -> ``x: is a directory`` (the path first): how the
    command line and the Python API word an unusable path."""
    path = err.filename if err.filename is not None else ""
    reason = (err.strerror or str(err)).lower() if err.strerror else str(err)
    return f"{path}: {reason}" if path else reason


class UnknownKey(KeyError, CnsbenchError):
    """A name the user gave that a table of known names lacks (a kind, a corruption, a slider).
    A ``KeyError`` for lookups that catch one, worded as its message (not quoted)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""
