"""Retrying storage calls on transient errors, with backoff and a bounded budget.

Object stores answer a busy moment with throttling (HTTP 429/503 ``SlowDown``), a server
error (5xx), a reset connection or a timeout; a build of hours meets all of them.  Every
primitive of :class:`pipeline.io.store.OutputStore` goes through :func:`retrying`: a
transient error is retried with exponential backoff and jitter until the budget (attempts
and seconds) is spent; anything else (a missing file, a permission error, a full disk)
propagates at once.  A call that still fails raises :class:`StorageError` naming the
operation and the path, and the stage that called it fails its shard: nothing is half
committed (a shard's manifest is written last), and the next run redoes the shard.
Missing or refused credentials are not retried: they raise
:class:`pipeline.io.access.StorageAccessError` naming the path and where credentials were
looked for.

The budget is read from the environment so that every Ray worker uses the same:
``CNSBENCH_STORAGE_RETRIES`` (attempts after the first, default 6) and
``CNSBENCH_STORAGE_RETRY_SECONDS`` (total wait, default 60).

Retries are tuned in this one layer.  The output store's filesystem
(:func:`store_filesystem`) makes one attempt per call beneath it: s3fs's own loop
(``S3FileSystem.retries``, 5 tries) and botocore's (legacy mode, up to 5 attempts) would
otherwise multiply the budget above (6 x 5 x 5 requests for one failing read, minutes of
waiting).  Other readers (sources, slider stores) keep the clients' own retries: nothing
above them retries.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import random
import time
from typing import Any, Callable, TypeVar

from pipeline.io.access import access_error

log = logging.getLogger(__name__)
T = TypeVar("T")

_TRANSIENT_ERRNOS = {errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EPIPE, errno.EAGAIN}
_TRANSIENT_WORDS = (
    "slowdown", "slow down", "throttl", "toomanyrequests", "too many requests", "serviceunavailable",
    "service unavailable", "internalerror", "internal error", "requesttimeout", "request timeout",
    "bad gateway", "gateway timeout", "connection reset", "connection aborted", "connection closed",
    "server disconnected", "incompleteread", "incomplete read", "response payload is not completed",
    "timed out", "timeout", "503", "502", "504", "500 ", "429",
)
_TRANSIENT_TYPES = (
    "ClientConnectionError", "ServerDisconnectedError", "ClientPayloadError", "ClientOSError",
    "EndpointConnectionError", "ConnectionClosedError", "ReadTimeoutError", "ConnectTimeoutError",
    "IncompleteRead", "ResponseStreamingError", "FSTimeoutError", "ProtocolError",
    # s3fs: the object was replaced between the open (which took its ETag) and the read; the
    # next attempt, after the cache is invalidated, reads the new object whole.
    "FileExpired",
)


class StorageError(OSError):
    """A storage call that failed for good (not transient, or out of retries)."""


def is_transient(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) is worth retrying."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
            return False
        if isinstance(err, OSError) and err.errno == errno.ENOSPC:
            return False
        if isinstance(err, (ConnectionError, TimeoutError)):
            return True
        if isinstance(err, OSError) and err.errno in _TRANSIENT_ERRNOS:
            return True
        if any(t.__name__ in _TRANSIENT_TYPES for t in type(err).__mro__):
            return True
        text = str(err).lower()
        if any(word in text for word in _TRANSIENT_WORDS):
            return True
        err, seen = err.__cause__ or err.__context__, seen + 1
    return False


def budget() -> tuple[int, float]:
    return int(os.environ.get("CNSBENCH_STORAGE_RETRIES", "6")), float(os.environ.get("CNSBENCH_STORAGE_RETRY_SECONDS", "60"))


def call(op: str, path: str, fn: Callable[[], T], on_retry: Callable[[], Any] | None = None) -> T:
    """``fn()`` with retries on transient errors; ``on_retry`` runs before each new attempt."""
    retries, seconds = budget()
    start = time.monotonic()
    delay = 0.05
    for attempt in range(retries + 1):
        try:
            return fn()
        except Exception as err:
            if isinstance(err, StorageError):
                raise
            refused = access_error(err, path)
            if refused is not None:  # no credentials, or refused ones: retrying cannot help
                raise refused from err
            spent = time.monotonic() - start
            if not is_transient(err):
                raise
            if attempt == retries or spent + delay > seconds:
                raise StorageError(
                    errno.EIO, f"storage: {op} {path} still failing after {attempt + 1} attempt(s) "
                    f"in {spent:.1f} s: {type(err).__name__}: {err}"
                ) from err
            log.warning("storage: %s %s: %s (transient, retry %d of %d)", op, path, err, attempt + 1, retries)
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 5.0)
            if on_retry is not None:
                on_retry()
    raise AssertionError("unreachable")


# The S3 client of an output store: one attempt per request (botocore's "standard" mode with a
# total of one attempt), the retries being this module's.
SINGLE_ATTEMPT_S3: dict[str, Any] = {"config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"}}}


def store_filesystem(uri: str) -> tuple[Any, str]:
    """``(fsspec filesystem, root)`` of an output store at ``uri``, with the client's own retries
    off where it has them (S3: s3fs and botocore), so :func:`call` is the only retrying layer."""
    import fsspec

    protocol = fsspec.core.split_protocol(uri)[0]
    if protocol not in ("s3", "s3a"):
        return fsspec.core.url_to_fs(uri)
    fs, root = fsspec.core.url_to_fs(uri, **SINGLE_ATTEMPT_S3)
    fs.retries = 1  # s3fs's loop around each call (a class attribute, no constructor argument)
    return fs, root


def retrying(op: str) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorator for an ``OutputStore`` method whose first argument is a relative path."""

    def wrap(method: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(method)
        def inner(self, rel: str, *args, **kwargs) -> T:
            def invalidate() -> None:
                if not getattr(self, "local", True):
                    self.fs.invalidate_cache()

            where = f"{self.uri.rstrip('/')}/{rel}"  # for messages only: the method itself confines rel
            return call(op, where, lambda: method(self, rel, *args, **kwargs), on_retry=invalidate)

        return inner

    return wrap
