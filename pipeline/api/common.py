"""What every function of the Python API shares: one exception type, and a config read once.

Every error the library raises about the user's input already is a
:class:`pipeline.errors.CnsbenchError`; :func:`user_errors` words the remaining kind, an
unusable path or refused credentials (an ``OSError``, a :class:`StorageAccessError`), the way
the command line prints it.  Anything else (a bug, a lost lease, a storage failure that is
not the input's fault) keeps its type and traceback.
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
    if isinstance(err, (CnsbenchError, StorageAccessError)):
        return str(err)
    if isinstance(err, OSError):
        return describe_os_error(err)
    return None


@contextmanager
def user_errors() -> Iterator[None]:
    """Raise a user's mistake inside the block as :class:`CnsbenchError` (same message)."""
    from pipeline.runtime.progress import quiet_unless_verbose

    quiet_unless_verbose()
    try:
        yield
    except CnsbenchError as err:
        api_words(err)
        raise
    except (OSError, StorageAccessError) as err:
        msg = user_message(err)
        if msg is None:
            raise
        raise CnsbenchError(msg) from err


# The command line's flags -> the API's arguments, in a message raised to a Python caller.
_FLAGS = (("--output", "output"), ("--new-version", "new_version=True"), ("--name", "name"), ("--runner", "runner"),
          ("--classifiers", "classifiers"), ("--in-place", "in_place=True"), ("--refine", "refine"),
          ("--rounds", "rounds"), ("--suite", "suite"), ("--classifier", "classifier"), ("--config", "config"),
          ("--filter", "filter=True"), ("--force", "force=True"))


def api_words(err: CnsbenchError) -> None:
    """Word ``err`` for the API: its flags become the API's arguments; the command line's own
    wording stays in ``err.command_line``, which the command prints."""
    import re

    text = str(err)
    if "--" not in text or getattr(err, "command_line", None):
        return
    worded = text
    for flag, arg in _FLAGS:
        worded = re.sub(re.escape(flag) + r"(?![\w-])", arg, worded)
    if worded != text:
        err.command_line = text  # type: ignore[attr-defined]
        err.args = (worded, *err.args[1:])


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


def check_runner(runner: str) -> None:
    """Refuse an unknown ``runner`` naming the API's argument (``--runner`` on the command line)."""
    from pipeline.executors import executor_class

    try:
        executor_class(runner)
    except CnsbenchError as err:
        raise CnsbenchError(str(err).replace("--runner:", "runner:", 1)) from None


def path_arg(value: Any, what: str) -> str:
    """A path argument (a ``str`` or any ``os.PathLike``, e.g. ``pathlib.Path``) as text; an
    empty one, or another type, refused naming the argument ``what``."""
    if not isinstance(value, (str, os.PathLike)):
        raise CnsbenchError(f"{what}: a folder or URI (str or os.PathLike), got a {type(value).__name__}")
    text = os.fspath(value)
    if not text.strip():
        err = CnsbenchError(f"{what} is empty: give a folder or URI")
        err.command_line = f"--{what.replace('_', '-')} is empty: give a folder or URI"  # type: ignore[attr-defined]
        raise err
    return text
