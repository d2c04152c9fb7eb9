"""Command line: ``cnsbench <command>``, one module per command in this package.

Every command is reachable in-process as ``main(argv) -> exit code`` (tests call it
that way); errors in the user's input print one clear message and return 2, a stop by
Ctrl-C or SIGTERM returns 130 after saying how to resume, a writer whose output lease was
taken over returns 1 saying so.  A user's mistake is a :class:`pipeline.errors.CnsbenchError`
(the one base of every such error) or an unusable path (an ``OSError``); anything else is
a bug and keeps its traceback.  Each command module has
``register(subparsers)`` (its arguments) and ``run(args) -> int``.  The library never
imports this package.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

from pipeline.runtime.checkout import DEMO_CONFIG, REPO_ROOT, TINY_CONFIG  # noqa: F401 (for callers and tests)
from pipeline.errors import CnsbenchError, describe_os_error
from pipeline.io.access import StorageAccessError, access_error
from pipeline.io.lease import LeaseLost
from pipeline.io.retry import StorageError
from pipeline.runtime.stopping import EXIT_INTERRUPTED, interrupted, stop_on_signals

# In the order `cnsbench --help` lists them.
COMMANDS = ("validate", "prefetch", "build", "evaluate", "refine", "aggregate", "compare", "card", "leaderboard", "digest", "status", "ls", "demo", "train_sliders", "calibrate_filter", "serve", "submit", "estimate",)


def make_parser() -> argparse.ArgumentParser:
    import importlib

    p = argparse.ArgumentParser(prog="cnsbench", description="Robustness benchmarks from continuous nuisance shifts.")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"pipeline.cli.{name}").register(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from pipeline.runtime.progress import set_verbose

    set_verbose(args.verbose)
    try:
        with stop_on_signals():
            return args.func(args)
    except KeyboardInterrupt:
        print(interrupted(args.command, argv), file=sys.stderr)
        return EXIT_INTERRUPTED
    except StorageAccessError as err:  # no or refused credentials, a closed endpoint: one line, the URL named
        print(f"cnsbench {args.command}: error: {err}", file=sys.stderr)
        return 2
    except LeaseLost as err:  # another writer took the output over: this one stopped committing
        print(f"cnsbench {args.command}: stopped: {err}", file=sys.stderr)
        return 1
    except StorageError as err:  # out of retries, or a full disk: committed work is kept
        print(f"cnsbench {args.command}: {err.strerror or err}", file=sys.stderr)
        return 1
    except CnsbenchError as err:  # the user's input, named in the message (in the command's words)
        print(f"cnsbench {args.command}: error: {getattr(err, 'command_line', None) or err}", file=sys.stderr)
        return 2
    except OSError as err:  # a path of the wrong kind, unreadable or unwritable, a full disk
        # An object store's "Forbidden" names no file: say which URL, with which credentials.
        refused = access_error(err, url_argument(argv)) if err.filename is None else None
        print(f"cnsbench {args.command}: error: {refused or describe_os_error(err)}", file=sys.stderr)
        return 2
    except Exception as err:  # a storage client's own credentials error, raised outside OutputStore
        refused = access_error(err, url_argument(argv))
        if refused is None:
            raise
        print(f"cnsbench {args.command}: error: {refused}", file=sys.stderr)
        return 2


def url_argument(argv: Sequence[str] | None) -> str:
    """The first URL among the command's arguments ("" when none): what a storage error is about."""
    return next((a for a in (sys.argv[1:] if argv is None else argv) if "://" in a), "")
