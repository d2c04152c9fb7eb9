"""Starting and stopping the Serve application on this machine (``cnsbench serve``: :mod:`pipeline.cli.serve`).

:func:`run_server` starts (or joins) a local Ray, deploys the application of
:func:`~pipeline.serve.deployments.make_app` at ``http://host:port/``, waits until it
answers, and with ``blocking`` serves until interrupted.
"""

from __future__ import annotations

import os
import socket
import time
from typing import TYPE_CHECKING, Any

from pipeline.config import load_config
from pipeline.errors import CnsbenchError
from pipeline.serve.deployments import make_app
from pipeline.serve.index import open_output
from pipeline.serve.options import (
    APP_NAME,
    DEFAULT_HOST,
    DEFAULT_PORT,
    LOOPBACK_HOSTS,
    TOKEN_ENV,
    ServeOptions,
)

if TYPE_CHECKING:
    pass


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def check_port_free(host: str, port: int) -> None:
    """ValueError naming host:port when nothing can listen there."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError as err:
            raise CnsbenchError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None


def wait_until_serving(host: str, port: int, timeout: float = 30.0) -> None:
    """Fail loudly when nothing answers at host:port after ``serve.run``.

    Serve keeps the HTTP options of an instance already running in the cluster (it only
    logs that new ones are ignored), so the app could be up on another port than asked.
    """
    import urllib.error
    import urllib.request

    probe = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
    if ":" in probe and not probe.startswith("["):
        probe = f"[{probe}]"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"http://{probe}:{port}/healthz", timeout=5):
                return
        except urllib.error.HTTPError:
            return  # something of ours answered (e.g. a Host check); it is serving
        except OSError as err:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the app is deployed but nothing answers on {host}:{port} ({err}); is Serve already "
                    "running in this Ray cluster with other http options? `serve shutdown` it first"
                ) from None
            time.sleep(0.5)


def run_server(
    config: str | None = None,
    output: str | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    token: str | None = None,
    blocking: bool = True,
    *,
    echo: Any = print,
    **options: Any,
) -> str:
    """Start the app on a local Ray (or the one already initialised) at ``http://host:port/``.

    Returns the URL once every deployment is ready; with ``blocking`` it then serves
    until interrupted and shuts Serve (and a Ray it started) down.  Extra keyword
    arguments are :class:`~pipeline.serve.options.ServeOptions` fields.  On a loopback
    ``host`` only loopback ``Host`` headers are accepted unless ``allowed_hosts`` says
    otherwise.
    """
    import ray
    from ray import serve

    if not 1 <= int(port) <= 65535:
        raise CnsbenchError(f"port must be in 1..65535, got {port}")
    token = token or os.environ.get(TOKEN_ENV) or None
    if options.get("allowed_hosts") is None and is_loopback(host):
        options["allowed_hosts"] = ["127.0.0.1", "localhost", "[::1]"]
    opts = ServeOptions(config=config, output=output, token=token, **options)
    app = make_app(opts)  # validates config and output before anything starts
    if not is_loopback(host) and not opts.token:
        echo(f"[cnsbench] WARNING: serving on {host} without a token: anyone who reaches it can use the API")
    check_port_free(host, port)

    started_ray = False
    if not ray.is_initialized():
        from pipeline.executors.ray_data import init_ray

        sizing = load_config(config) if config else None
        if sizing is None and output:
            from pipeline.aggregate.run import load_output_config

            sizing = load_output_config(open_output(output))
        if sizing is not None:  # a local Ray sized for the config's pools, as a build's
            from pipeline.build import build_chain

            init_ray(None, build_chain(sizing), lambda m: echo(f"[cnsbench] {m}"))
        else:  # a new local Ray, whatever Ray's bootstrap file names (pipeline/executors/cluster.py)
            ray.init(address="local", include_dashboard=False)
        started_ray = True
    try:
        serve.start(http_options={"host": host, "port": int(port)})
        serve.run(app, name=APP_NAME, route_prefix="/")
    except BaseException:
        if started_ray:
            serve.shutdown()
            ray.shutdown()
        raise
    shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
    url = f"http://{shown}:{int(port)}/"
    wait_until_serving(host, int(port))
    echo(f"[cnsbench] serving {url}" + (" (API token required)" if opts.token else ""))
    if not blocking:
        return url
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        echo("[cnsbench] stopping")
    finally:
        serve.shutdown()
        if started_ray:
            ray.shutdown()
    return url
