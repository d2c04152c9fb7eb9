"""Object storage that will not let us in, said in one line: no credentials, refused ones, a closed endpoint.

Without this, a missing key ends in botocore's ``NoCredentialsError`` eighty lines down a
traceback, a refused one in a bare ``Forbidden``, and a closed endpoint in a minute of
retries.  Each becomes a :class:`StorageAccessError` whose message names the URL, the
endpoint and where credentials were looked for (the variables and the profile files, never
their values); the CLI prints it as one line and exits 2.

:class:`StorageAccessError` is deliberately neither an ``OSError`` nor a ``ValueError``:
code that treats those as a damaged file (a malformed manifest is quarantined) must never
mistake "we may not read it" for "it is broken".

A closed endpoint is found before the first request (:func:`check_endpoint`, one TCP
connect of at most a few seconds), because the S3 client retries a refused connection
with backoff inside every call, about 8 s each, and our own retries (:mod:`.retry`) multiply
that.  An endpoint that answered once and goes away later is a transient fault like any
other and is retried as before.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Any
from urllib.parse import urlsplit

# Exception type names (no botocore / google import needed) meaning "no usable credentials".
_CREDENTIAL_TYPES = (
    "NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError", "NoAuthTokenError",
    "UnauthorizedSSOTokenError", "SSOTokenLoadError", "InvalidConfigError", "ProfileNotFound",
    "DefaultCredentialsError", "RefreshError",
)
CONNECT_TIMEOUT_S = 5.0
_reachable: set[str] = set()  # endpoints that accepted a connection in this process
_lock = threading.Lock()


class StorageAccessError(Exception):
    """Object storage refused access or cannot be reached; the message is one line naming the URL."""


def _scheme(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def _env_state(name: str) -> str:
    value = os.environ.get(name)
    return "not set" if value is None else ("set but empty" if not value.strip() else "set")


def s3_endpoint(fs: Any = None) -> tuple[str, str] | None:
    """(endpoint URL, where it came from) when one is configured; None for the default AWS endpoints."""
    if fs is not None:
        for where, value in (
            ("endpoint_url", getattr(fs, "endpoint_url", None)),
            ("client_kwargs.endpoint_url", (getattr(fs, "client_kwargs", None) or {}).get("endpoint_url")),
        ):
            if value:
                return str(value), where
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(name, "").strip():
            return os.environ[name].strip(), name
    return None


def s3_credential_sources() -> str:
    """Where the S3 client looks for credentials, in its order, with what was found (no values)."""
    keys = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    states = {_env_state(k) for k in keys}
    parts = [f"{' and '.join(keys)} ({', '.join(sorted(states))})"]
    profile = os.environ.get("AWS_PROFILE", "").strip() or "default"
    files = []
    for var, default in (("AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials"), ("AWS_CONFIG_FILE", "~/.aws/config")):
        path = os.path.expanduser(os.environ.get(var) or default)
        files.append(f"{path} ({'present' if os.path.isfile(path) else 'no such file'}{', from ' + var if os.environ.get(var) else ''})")
    parts.append(f"profile {profile!r}{' (AWS_PROFILE)' if os.environ.get('AWS_PROFILE') else ''} in " + " and ".join(files))
    for var in ("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        if os.environ.get(var):
            parts.append(var)
    if os.environ.get("AWS_EC2_METADATA_DISABLED", "").strip().lower() == "true":
        parts.append("instance metadata (off: AWS_EC2_METADATA_DISABLED=true)")
    else:
        parts.append("instance metadata (none answered)")
    return "; ".join(parts)


def s3_credentials_used() -> str:
    """Which source the S3 client took its credentials from (the first that has some)."""
    if all(os.environ.get(k, "").strip() for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")):
        return "the keys in AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY" + (
            " (with AWS_SESSION_TOKEN)" if os.environ.get("AWS_SESSION_TOKEN") else ""
        )
    profile = os.environ.get("AWS_PROFILE", "").strip() or "default"
    return f"profile {profile!r} (AWS_PROFILE, AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE) or the instance's role"


def _where(url: str, fs: Any = None) -> str:
    endpoint = s3_endpoint(fs) if _scheme(url) in ("s3", "s3a") else None
    return f"{url} (endpoint {endpoint[0]} from {endpoint[1]})" if endpoint else url


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__


def access_error(err: BaseException, url: str, fs: Any = None) -> StorageAccessError | None:
    """A :class:`StorageAccessError` for ``err`` raised while using ``url``; None when ``err``
    is something else (a missing file, a transient fault, a local permission problem)."""
    if isinstance(err, StorageAccessError):
        return err
    scheme = _scheme(url)
    if not scheme or scheme == "file":
        return None
    chain, seen = err, 0
    while chain is not None and seen < 8:
        if any(t.__name__ in _CREDENTIAL_TYPES for t in type(chain).__mro__):
            if scheme in ("s3", "s3a"):
                return StorageAccessError(
                    f"{_where(url, fs)}: no credentials for object storage ({type(chain).__name__}); looked at "
                    f"{s3_credential_sources()}. Set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
                )
            return StorageAccessError(f"{_where(url, fs)}: no usable credentials ({type(chain).__name__}: {_first_line(chain)})")
        chain, seen = chain.__cause__ or chain.__context__, seen + 1
    if isinstance(err, PermissionError):
        used = s3_credentials_used() if scheme in ("s3", "s3a") else "the configured credentials"
        return StorageAccessError(
            f"{_where(url, fs)}: access denied ({_first_line(err)}) with {used}; check the keys, their "
            "permissions on the bucket, and the endpoint"
        )
    return None


def check_endpoint(url: str, fs: Any = None) -> None:
    """Raise :class:`StorageAccessError` when the configured S3 endpoint of ``url`` refuses connections.

    Only an explicitly configured endpoint (``AWS_ENDPOINT_URL``, the filesystem's
    ``endpoint_url``) is checked, once per process while it answers; the default AWS
    endpoints are not (a cluster without a route to them fails in the client as before).
    """
    if _scheme(url) not in ("s3", "s3a"):
        return
    found = s3_endpoint(fs)
    if found is None:
        return
    endpoint, source = found
    with _lock:
        if endpoint in _reachable:
            return
    parts = urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
    host = parts.hostname
    if not host:
        raise StorageAccessError(f"{url}: the object-storage endpoint {endpoint!r} from {source} is not a URL")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise StorageAccessError(f"{url}: the object-storage endpoint {endpoint!r} from {source} has a bad port") from None
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as err:
        reason = err.strerror or type(err).__name__
        if isinstance(err, socket.timeout):
            reason = f"no answer in {CONNECT_TIMEOUT_S:g} s"
        raise StorageAccessError(
            f"{url}: cannot connect to the object-storage endpoint {endpoint} (from {source}): {reason.lower()}; "
            "is the server running and the URL right?"
        ) from None
    with _lock:
        _reachable.add(endpoint)
