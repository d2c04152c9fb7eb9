"""Submit builds to a remote Ray cluster through the Ray Jobs API, and follow them.

Thin, testable wrappers around :class:`ray.job_submission.JobSubmissionClient`:

* :func:`submit_build` packages the repository as the job's ``working_dir`` (the
  repo's ``.gitignore`` turned into ``runtime_env["excludes"]``, plus ``.git``,
  ``.venv`` and ``/runs`` always) and runs
  ``python -m pipeline.cli build <config> --output <uri>`` on the cluster.
* :func:`job_status`, :func:`job_logs`, :func:`stop_job`, :func:`wait_job` follow it.
* :mod:`pipeline.cli.submit` registers ``cnsbench submit`` and ``cnsbench jobs ...`` (the
  command line: its options, the cluster address from the environment, the exit codes).

Resuming: a build resumes when the same command is run again on the same
``--output``; after a preemption or a lost head node, submit the same config with
the same output URI again.  A new version of a benchmark goes to a new output URI.
``new_version=True`` / ``--new-version`` appends ``--new-version`` to the build
command and is refused up front when the caller's ``accepts`` says this checkout's
``cnsbench build`` has no such option.

Token authentication (Ray 2.60)
-------------------------------
Ray reads ``RAY_AUTH_MODE`` (``token`` or ``disabled``).  A new local cluster started
by ``ray.init()`` turns it on by default (``RAY_AUTH_MODE=token`` unless it is set
to ``disabled``), ``ray start --head`` turns it on when a token already exists, and
the cluster configs in ``deploy/`` set ``RAY_AUTH_MODE=token`` explicitly.  The token
is looked up, highest precedence first, in ``RAY_AUTH_TOKEN``, the file named by
``RAY_AUTH_TOKEN_PATH``, then ``~/.ray/auth_token``, and is sent to the dashboard
(which serves the Jobs API) as the HTTP header ``Authorization: Bearer <token>``.

On the client side Ray's ``SubmissionClient`` only adds that header when token
mode is on *in the client process* (``RAY_AUTH_MODE=token`` in its environment, see
``ray/dashboard/modules/dashboard_sdk.py`` and
``ray/_private/authentication/http_token_authentication.py``), and it never
overrides an ``Authorization`` header passed in ``headers=``.  So a user with
``RAY_AUTH_TOKEN_PATH`` set but ``RAY_AUTH_MODE`` unset would get
``401 Unauthorized``.  This module therefore resolves the token itself
(:func:`resolve_token`) and passes the header explicitly; the token never goes into
the job's ``runtime_env`` or metadata.

The Ray import is deferred to the functions that talk to a cluster so that
``cnsbench --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from pipeline.errors import CnsbenchError
from pipeline.io.nested import iter_strings

if TYPE_CHECKING:  # pragma: no cover
    from ray.job_submission import JobSubmissionClient

#: Always left out of the uploaded working_dir (gitwildmatch patterns, relative to it).
ALWAYS_EXCLUDE: tuple[str, ...] = (".git", ".venv", "/runs")

#: Environment variables Ray reads for token authentication.
AUTH_MODE_ENV = "RAY_AUTH_MODE"
AUTH_TOKEN_ENV = "RAY_AUTH_TOKEN"
AUTH_TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"
DEFAULT_TOKEN_PATH = Path("~/.ray/auth_token")

#: Environment variables that Ray lets override an explicit Jobs API address.
ADDRESS_ENVS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")

TERMINAL_STATUSES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})


# --------------------------------------------------------------------------- packaging
def find_repo_root(start: str | os.PathLike[str] | None = None) -> Path:
    """The repository root: the checkout this module lives in, else a parent of ``start``
    (default: the current directory) holding ``pyproject.toml`` and ``pipeline/``."""
    here = Path(__file__).resolve().parents[2]
    if (here / "pyproject.toml").is_file() and (here / "pipeline").is_dir():
        return here
    cur = Path(start or os.getcwd()).resolve()
    for cand in (cur, *cur.parents):
        if (cand / "pyproject.toml").is_file() and (cand / "pipeline").is_dir():
            return cand
    raise FileNotFoundError(
        f"no cnsbench checkout (pyproject.toml + pipeline/) at or above {cur}; pass working_dir"
    )


def gitignore_excludes(gitignore: str | os.PathLike[str]) -> list[str]:
    """Turn a ``.gitignore`` into Ray ``runtime_env["excludes"]`` patterns.

    Ray matches ``excludes`` with gitwildmatch (the ``.gitignore`` syntax) against
    paths relative to the working_dir, so patterns carry over unchanged: blank lines
    and comments are dropped, unescaped trailing spaces trimmed, ``!`` negations and
    ``/`` anchors kept.  Ray matches a *directory* by its path without a trailing
    slash, so a directory-only pattern such as ``build/`` excludes the files under
    ``build`` but still walks it; each such pattern is therefore followed by the same
    pattern without the slash, which prunes the directory itself (and would also
    drop a plain *file* of that name).  A missing file gives ``[]``.
    """
    path = Path(gitignore)
    if not path.is_file():
        return []
    out: list[str] = []
    for raw in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = raw.rstrip("\r")
        if not line.endswith("\\ "):  # an escaped trailing space is significant
            line = line.rstrip(" ")
        if not line or line.startswith("#"):
            continue
        out.append(line)
        body = line[1:] if line.startswith("!") else line
        if body.endswith("/") and body.strip("/"):
            out.append(line.rstrip("/"))
    return out


def working_dir_excludes(working_dir: str | os.PathLike[str]) -> list[str]:
    """``excludes`` for ``working_dir``: its ``.gitignore`` then :data:`ALWAYS_EXCLUDE`
    (last, so a ``!`` negation in ``.gitignore`` cannot re-include them)."""
    return gitignore_excludes(Path(working_dir) / ".gitignore") + list(ALWAYS_EXCLUDE)


def _is_excluded(rel_posix: str, excludes: Sequence[str]) -> bool:
    """Whether Ray's matcher would drop ``rel_posix`` (or one of its parent dirs): Ray matches
    ``excludes`` with (a vendored copy of) ``pathspec``'s ``gitwildmatch`` patterns, as here."""
    from pathspec import PathSpec

    spec = PathSpec.from_lines("gitwildmatch", list(excludes))
    parts = rel_posix.split("/")
    return any(spec.match_file("/".join(parts[: i + 1])) for i in range(len(parts)))


def build_entrypoint(
    config_rel: str, output_uri: str, *, new_version: bool = False, sets: Sequence[str] = ()
) -> str:
    """The shell command the job runs (inside the unpacked working_dir); ``sets``: ``--set`` items."""
    cmd = ["python", "-m", "pipeline.cli", "build", config_rel, "--output", output_uri]
    if new_version:
        cmd.append("--new-version")
    cmd += [f"--set={item}" for item in sets]
    return " ".join(shlex.quote(c) for c in cmd)


def build_runtime_env(
    working_dir: str | os.PathLike[str], extra_pip: Sequence[str] | None = None
) -> dict[str, Any]:
    """``runtime_env`` for a build: the working_dir with its excludes, optional pip extras."""
    wd = Path(working_dir).resolve()
    if not wd.is_dir():
        raise NotADirectoryError(f"working_dir {wd} is not a directory")
    env: dict[str, Any] = {
        "working_dir": str(wd),
        "excludes": working_dir_excludes(wd),
        "env_vars": {"PYTHONUNBUFFERED": "1"},
    }
    if extra_pip:
        env["pip"] = [str(p) for p in extra_pip]
    return env


def _config_relative(config_path: str | os.PathLike[str], working_dir: Path, excludes: Sequence[str]) -> str:
    cfg = Path(config_path).expanduser()
    cfg = (cfg if cfg.is_absolute() else Path.cwd() / cfg).resolve()
    if not cfg.is_file():
        raise FileNotFoundError(f"config file not found: {cfg}")
    try:
        rel = cfg.relative_to(working_dir).as_posix()
    except ValueError:
        raise CnsbenchError(
            f"config {cfg} is outside the working_dir {working_dir}; only the working_dir is uploaded"
        ) from None
    if _is_excluded(rel, excludes):
        raise CnsbenchError(f"config {rel} is excluded from the upload (.gitignore / {list(ALWAYS_EXCLUDE)})")
    _check_config_paths(cfg, working_dir, excludes)
    return rel


def _check_config_paths(cfg: Path, working_dir: Path, excludes: Sequence[str]) -> None:
    """Relative paths in a config (``./x``, ``../x``: resolved against the config's directory)
    must point into the uploaded working_dir, or they will not exist on the cluster."""
    import yaml

    try:
        raw = yaml.safe_load(cfg.read_text())
    except (OSError, yaml.YAMLError):
        return  # the build itself reports unreadable configs
    bad: list[str] = []
    for value in dict.fromkeys(iter_strings(raw)):
        if not value.startswith(("./", "../")):
            continue
        target = os.path.normpath(cfg.parent / value)
        try:
            rel = Path(target).relative_to(working_dir).as_posix()
        except ValueError:
            bad.append(f"{value} (outside the working_dir)")
            continue
        if _is_excluded(rel, excludes):
            bad.append(f"{value} (excluded from the upload)")
    if bad:
        shown = "; ".join(bad[:4]) + (f"; and {len(bad) - 4} more" if len(bad) > 4 else "")
        raise CnsbenchError(
            f"{cfg.name} refers to files that will not exist on the cluster: {shown}. "
            "Use hub ids or URIs (e.g. s3://bucket/cnsbench/sliders) for models, sliders and "
            "class tokens, or keep the files in the repository"
        )


def _check_output(output_uri: str) -> None:
    if not output_uri:
        raise CnsbenchError("an output URI is required")
    if "://" not in output_uri and not os.path.isabs(output_uri):
        raise CnsbenchError(
            f"output {output_uri!r} is a relative path: the job runs in a temporary copy of the "
            "working_dir on the cluster; use a URI (s3://bucket/prefix) or an absolute path on "
            "storage every node shares"
        )


# --------------------------------------------------------------------------- auth
def _read_token_file(path: str | os.PathLike[str], what: str) -> str:
    p = Path(path).expanduser()
    try:
        token = p.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {p} does not exist") from None
    if not token:
        raise CnsbenchError(f"{what} {p} is empty")
    return token


def resolve_token(token_file: str | os.PathLike[str] | None = None) -> str | None:
    """The Ray auth token to send, or ``None`` to leave it to Ray.

    Order: ``token_file`` (explicit), ``$RAY_AUTH_TOKEN``, the file ``$RAY_AUTH_TOKEN_PATH``
    (missing or empty is an error, as in Ray), and, only when ``RAY_AUTH_MODE=token``,
    ``~/.ray/auth_token`` if it exists (what Ray itself would send).  Surrounding
    whitespace is stripped, as Ray's token loader does.
    """
    if token_file:
        return _read_token_file(token_file, "token file")
    env_token = os.environ.get(AUTH_TOKEN_ENV, "").strip()
    if env_token:
        return env_token
    env_path = os.environ.get(AUTH_TOKEN_PATH_ENV, "").strip()
    if env_path:
        return _read_token_file(env_path, f"${AUTH_TOKEN_PATH_ENV}")
    if os.environ.get(AUTH_MODE_ENV, "").strip().lower() == "token":
        default = DEFAULT_TOKEN_PATH.expanduser()
        if default.is_file():
            return _read_token_file(default, "token file")
    return None


def auth_headers(token_file: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """``{"Authorization": "Bearer <token>"}`` for :func:`resolve_token`, else ``{}``."""
    token = resolve_token(token_file)
    return {"Authorization": f"Bearer {token}"} if token else {}


@contextlib.contextmanager
def _explicit_address(address: str | None) -> Iterator[None]:
    """Ray lets ``$RAY_API_SERVER_ADDRESS``/``$RAY_ADDRESS`` override an explicit address;
    hide them while the client is built so that ``--address`` means what it says."""
    if not address:
        yield
        return
    saved = {k: os.environ.pop(k) for k in ADDRESS_ENVS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def make_client(address: str | None, *, token_file: str | os.PathLike[str] | None = None) -> "JobSubmissionClient":
    """A ``JobSubmissionClient`` for ``address`` (e.g. ``http://127.0.0.1:8265``) that sends
    the auth token when one is configured.  ``address=None`` lets Ray resolve it
    (``$RAY_API_SERVER_ADDRESS``, ``$RAY_ADDRESS``, a local cluster).  Raises
    ``ray.exceptions.AuthenticationError`` on a missing (401) or wrong (403) token."""
    from ray.job_submission import JobSubmissionClient

    headers = auth_headers(token_file)
    with _explicit_address(address):
        return JobSubmissionClient(address, headers=headers or None)


# --------------------------------------------------------------------------- jobs
def submit_build(
    config_path: str | os.PathLike[str],
    output_uri: str,
    address: str | None,
    *,
    working_dir: str | os.PathLike[str] | None = None,
    extra_pip: Sequence[str] | None = None,
    entrypoint_num_gpus: float = 0,
    entrypoint_num_cpus: float = 1,
    new_version: bool = False,
    token_file: str | os.PathLike[str] | None = None,
    sets: Sequence[str] = (),
    accepts: Callable[..., bool | None] | None = None,
) -> str:
    """Submit ``cnsbench build`` as a Ray job; returns the submission id.

    ``working_dir`` (default: the repository root) is zipped and uploaded, minus its
    ``.gitignore``d paths and ``.git``/``.venv``/``runs``; ``config_path`` (relative to
    the current directory, or absolute) must lie inside it.  ``entrypoint_num_*`` are
    reserved for the driver process only; the stages request their own GPUs.  Note
    that a driver requesting no resources (``entrypoint_num_cpus=0`` and no GPUs) is
    pinned by Ray to the head node, which on the deploy/ clusters is the on-demand
    node, while any request lets Ray place it on a (spot) worker.

    Submitting again with the same ``output_uri`` resumes the build.  ``new_version``
    adds ``--new-version`` to the build command; ``ValueError`` if ``accepts("--new-version")``
    (whether this checkout's ``cnsbench build`` takes those arguments; None: unknown, the
    cluster will tell) is False: use a new ``output_uri`` then.  Local
    checks (config inside the working_dir and not excluded, its ``./``/``../`` paths
    uploaded too, output not a relative path) run before the cluster is contacted.

    Token auth: see the module docstring; ``token_file`` wins over
    ``$RAY_AUTH_TOKEN``/``$RAY_AUTH_TOKEN_PATH`` (Ray 2.60 defaults to
    ``RAY_AUTH_MODE=token`` for the clusters it starts).
    """
    wd = Path(working_dir).resolve() if working_dir is not None else find_repo_root()
    runtime_env = build_runtime_env(wd, extra_pip)
    rel = _config_relative(config_path, wd, runtime_env["excludes"])
    _check_output(output_uri)
    if new_version and accepts is not None and accepts("--new-version") is False:
        raise CnsbenchError(
            "`cnsbench build` in this checkout has no --new-version option; a build resumes "
            "on the same --output, so use a new --output for a new version"
        )
    entrypoint = build_entrypoint(rel, output_uri, new_version=new_version, sets=sets)
    client = make_client(address, token_file=token_file)
    return client.submit_job(
        entrypoint=entrypoint,
        runtime_env=runtime_env,
        metadata={"cnsbench.config": rel, "cnsbench.output": output_uri},
        entrypoint_num_cpus=entrypoint_num_cpus,
        entrypoint_num_gpus=entrypoint_num_gpus,
    )


def _status_str(status: Any) -> str:
    return str(getattr(status, "value", status))


def job_status(job_id: str, address: str | None, *, token_file: str | os.PathLike[str] | None = None) -> str:
    """``PENDING``, ``RUNNING``, ``SUCCEEDED``, ``FAILED`` or ``STOPPED``."""
    return _status_str(make_client(address, token_file=token_file).get_job_status(job_id))


def _iterate_async(agen: Any) -> Iterator[str]:
    loop = asyncio.new_event_loop()
    try:
        while True:
            try:
                yield loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(agen.aclose())
        loop.close()


def job_logs(
    job_id: str,
    address: str | None,
    follow: bool = False,
    *,
    token_file: str | os.PathLike[str] | None = None,
) -> str | Iterator[str]:
    """The job's driver log so far (``str``), or with ``follow=True`` an iterator of log
    chunks that ends when the job does (Ray's ``tail_job_logs`` websocket)."""
    client = make_client(address, token_file=token_file)
    if not follow:
        return client.get_job_logs(job_id)
    return _iterate_async(client.tail_job_logs(job_id))


def stop_job(job_id: str, address: str | None, *, token_file: str | os.PathLike[str] | None = None) -> bool:
    """Ask the job to stop; ``True`` if it was still running."""
    return bool(make_client(address, token_file=token_file).stop_job(job_id))


def wait_job(
    job_id: str,
    address: str | None,
    timeout_s: float,
    *,
    poll_s: float = 5.0,
    token_file: str | os.PathLike[str] | None = None,
) -> str:
    """Poll until the job is SUCCEEDED/FAILED/STOPPED and return that status; raises
    ``TimeoutError`` (naming the last status) after ``timeout_s`` seconds."""
    client = make_client(address, token_file=token_file)
    deadline = time.monotonic() + timeout_s
    while True:
        status = _status_str(client.get_job_status(job_id))
        if status in TERMINAL_STATUSES:
            return status
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"job {job_id} still {status} after {timeout_s:g} s")
        time.sleep(min(poll_s, left))
