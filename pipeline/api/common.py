"""What every function of the Python API shares: one exception type, and a config read once.

:func:`user_errors` turns the library's errors about the user's input (a config, a path, an
output of another command) into :class:`pipeline.errors.CnsbenchError` with the message the
command line prints for the same input; the project's own bugs keep their tracebacks, and a
lost lease or a storage failure (not the input's fault) keeps its type.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from pipeline.errors import CnsbenchError, describe_os_error
from pipeline.io.access import StorageAccessError
from pipeline.io.retry import StorageError

if TYPE_CHECKING:
    from pipeline.config import BuildConfig


def user_message(err: BaseException) -> str | None:
    """The one-line message of an error in the user's input, None for anything else."""
    if isinstance(err, StorageError):  # out of retries, a full disk: not the input's fault
        return None
    if isinstance(err, KeyError):
        return str(err.args[0]) if err.args else str(err)
    if isinstance(err, (ValueError, FileNotFoundError, StorageAccessError)):
        return str(err)
    if isinstance(err, OSError):
        return describe_os_error(err)
    return None


@contextmanager
def user_errors() -> Iterator[None]:
    """Raise a user's mistake inside the block as :class:`CnsbenchError` (same message)."""
    try:
        yield
    except CnsbenchError:
        raise
    except (ValueError, KeyError, OSError, StorageAccessError) as err:
        msg = user_message(err)
        if msg is None:
            raise
        raise CnsbenchError(msg) from err


def load_config_file(
    config: "str | os.PathLike[str] | BuildConfig",
    sets: Sequence[str] | None = None,
    overrides: dict[str, Any] | None = None,
) -> "BuildConfig":
    """A config file with ``overrides`` (a partial config) and ``--set`` items, validated; the
    generated assets it points at (``configs/tiny.yaml``'s) made on first use.  A
    :class:`BuildConfig` passes through (``sets`` and ``overrides`` then refused)."""
    from pipeline.config import BuildConfig, load_config
    from pipeline.demo.assets import ensure_config_assets

    if isinstance(config, BuildConfig):
        if sets or overrides:
            raise CnsbenchError("sets and overrides apply to a config file, not to a BuildConfig: change the object")
        cfg = config
    else:
        cfg = load_config(os.fspath(config), overrides, sets=list(sets) if sets else None)
    ensure_config_assets(cfg)
    return cfg
