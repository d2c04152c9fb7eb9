"""``cnsbench`` command: submit a build to a Ray cluster, and follow its jobs."""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import sys
from typing import Any

from pipeline.cli.options import add_max_gpus, add_max_gpus_argument, add_set_argument, load_cli_config
from pipeline.errors import CnsbenchError
from pipeline.runtime.jobs import (
    ADDRESS_ENVS,
    job_logs,
    job_status,
    stop_job,
    submit_build,
    wait_job,
)


def _address(args: argparse.Namespace) -> str | None:
    if args.address:
        return args.address
    for env in ADDRESS_ENVS:
        if os.environ.get(env):
            return None  # Ray resolves it from the environment
    raise CnsbenchError("no cluster address: pass --address http://127.0.0.1:8265 or set RAY_API_SERVER_ADDRESS")


def _report(err: BaseException) -> int:
    """Print one line; exit 2 for bad input (a value, a missing or wrong kind of file), else 1."""
    print(f"cnsbench: error: {err}", file=sys.stderr)
    bad_input = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)
    return 2 if isinstance(err, bad_input) else 1


def _add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--address",
        metavar="URL",
        default=None,
        help="Jobs API (dashboard) URL, e.g. http://127.0.0.1:8265 through `ray dashboard` or "
        "`kubectl port-forward`; default $RAY_API_SERVER_ADDRESS / $RAY_ADDRESS",
    )
    p.add_argument(
        "--token-file",
        metavar="F",
        default=None,
        help="file holding the cluster's Ray auth token (default: $RAY_AUTH_TOKEN, "
        "$RAY_AUTH_TOKEN_PATH, or ~/.ray/auth_token when RAY_AUTH_MODE=token)",
    )


def build_accepts(build_parser: argparse.ArgumentParser | None, *build_args: str) -> bool | None:
    """Whether this checkout's ``cnsbench build`` (its parser) accepts ``build_args`` (e.g.
    ``--new-version``); None without a build parser (the cluster will tell)."""
    if build_parser is None:
        return None
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            _, unknown = build_parser.parse_known_args(["config.yaml", *build_args])
    except SystemExit:  # an invalid value for a known option
        return False
    return not unknown


def _cmd_submit(args: argparse.Namespace) -> int:
    for flag, value in (("--num-gpus", args.num_gpus), ("--num-cpus", args.num_cpus)):
        if not math.isfinite(value) or value < 0:
            return _report(ValueError(f"{flag} must be a finite number >= 0, got {value:g}"))
    add_max_gpus(args)  # travels to the cluster's build as --set resources.max_gpus=N
    if args.sets:
        load_cli_config(args)  # a bad --set exits 2 here, not in the cluster's job
    try:
        job_id = submit_build(
            args.config,
            args.output,
            _address(args),
            working_dir=args.working_dir,
            extra_pip=args.pip or None,
            entrypoint_num_gpus=args.num_gpus,
            entrypoint_num_cpus=args.num_cpus,
            new_version=args.new_version,
            token_file=args.token_file,
            sets=args.sets,
            accepts=lambda *build_args: build_accepts(args.build_parser, *build_args),
        )
    except Exception as err:  # noqa: BLE001 - every failure becomes a message and exit 1
        return _report(err)
    print(job_id)
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    try:
        print(job_status(args.job_id, _address(args), token_file=args.token_file))
    except Exception as err:  # noqa: BLE001
        return _report(err)
    return 0


def _cmd_logs(args: argparse.Namespace) -> int:
    try:
        out = job_logs(args.job_id, _address(args), follow=args.follow, token_file=args.token_file)
        if isinstance(out, str):
            sys.stdout.write(out)
        else:
            for chunk in out:
                sys.stdout.write(chunk)
                sys.stdout.flush()
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001
        return _report(err)
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    try:
        stopped = stop_job(args.job_id, _address(args), token_file=args.token_file)
    except Exception as err:  # noqa: BLE001
        return _report(err)
    print("stop requested" if stopped else "job was not running")
    return 0


def _cmd_wait(args: argparse.Namespace) -> int:
    try:
        status = wait_job(args.job_id, _address(args), args.timeout, token_file=args.token_file)
    except Exception as err:  # noqa: BLE001
        return _report(err)
    print(status)
    return 0 if status == "SUCCEEDED" else 1



def register(subparsers: Any) -> None:
    """Register ``submit`` and ``jobs {status,logs,stop,wait}`` on an argparse
    ``subparsers`` object; each parser sets ``func(args) -> int`` (the exit code)."""
    sp = subparsers.add_parser(
        "submit",
        help="submit a build to a Ray cluster (Ray Jobs API); prints the job id",
        description="Upload the repository (minus .gitignore'd paths) and run "
        "`python -m pipeline.cli build CONFIG --output URI` as a Ray job. Submitting the same "
        "config with the same --output again resumes the build.",
    )
    sp.add_argument("config", help="build config, inside the repository (e.g. configs/my_benchmark.yaml)")
    add_set_argument(sp)
    sp.add_argument("--output", required=True, metavar="URI", help="output URI, e.g. s3://bucket/builds/name")
    _add_connection_args(sp)
    add_max_gpus_argument(sp)
    sp.add_argument("--num-gpus", type=float, default=0, metavar="N", help="GPUs reserved for the driver (default 0)")
    sp.add_argument("--num-cpus", type=float, default=1, metavar="N", help="CPUs reserved for the driver (default 1)")
    sp.add_argument(
        "--new-version",
        action="store_true",
        help="pass --new-version to `cnsbench build` (only if it has that option; otherwise use a new --output)",
    )
    sp.add_argument("--pip", action="append", metavar="PKG", help="extra pip requirement for the job (repeatable)")
    sp.add_argument("--working-dir", default=None, metavar="DIR", help="directory to upload (default: repo root)")
    # The build parser of this command line: which options the checkout's build accepts.
    sp.set_defaults(func=_cmd_submit, build_parser=subparsers.choices.get("build"))

    jp = subparsers.add_parser("jobs", help="status, logs, stop or wait for a submitted build")
    jsub = jp.add_subparsers(dest="jobs_command", metavar="{status,logs,stop,wait}")
    jsub.required = True
    for name, func, help_ in (
        ("status", _cmd_status, "print the job status"),
        ("logs", _cmd_logs, "print the driver log"),
        ("stop", _cmd_stop, "ask the job to stop"),
        ("wait", _cmd_wait, "wait until the job ends; exit 0 only if it SUCCEEDED"),
    ):
        p = jsub.add_parser(name, help=help_)
        p.add_argument("job_id", metavar="JOB_ID")
        _add_connection_args(p)
        if name == "logs":
            p.add_argument("-f", "--follow", action="store_true", help="stream until the job ends")
        if name == "wait":
            p.add_argument("--timeout", type=float, default=24 * 3600, metavar="S", help="seconds (default 86400)")
        p.set_defaults(func=func)
