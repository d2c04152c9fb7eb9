"""Ray Serve application: preview shifts live and browse a built benchmark in a browser.

Role
----
``cnsbench serve`` (:func:`~pipeline.serve.launch.run_server`) and ``serve run
pipeline.serve.app:build_app`` (:func:`~pipeline.serve.deployments.build_app`, also named
by ``deploy/serve.yaml`` and ``deploy/kuberay/rayservice.yaml``) start one Serve
application with three deployments, each scaled on its own: ``PreviewGenerator`` (the
config's generator and out-of-class filter, from ``resources.generate``),
``PreviewClassifier`` (every configured classifier, from ``resources.classify``) and
``Ingress`` (the JSON API, the web page at ``/``, and an in-memory index of a build
output's committed shards).  The two model deployments exist only with a config
(``--config``); the benchmark browser only with a build output (``--output``); at least
one of them is required.

Modules
-------
``options``      :class:`ServeOptions` (the app's arguments), deployment options, constants
``errors``       request errors (404/422/500/503) and JSON values of table cells
``preview``      preview requests: validation, model calls, the answer
``index``        the in-memory index of a build output (skips unreadable shards)
``middleware``   header limit, bearer token, body limit, security headers (ASGI)
``api``          the FastAPI routes and the web page (``static/``: index.html, app.css, app.js)
``deployments``  the Serve deployments, ``build_app``; ``in_process_api`` (no Ray)
``launch``       ``run_server`` and ``cnsbench serve``
``app``          the import path ``pipeline.serve.app:build_app`` (re-exports)

HTTP API
--------
``GET /healthz``                       always open; ``{"status": "ok"}``
``GET /``                              the web page (self-contained HTML+JS, no external resources)
``GET /api/info``                      what is loaded: benchmark summary (with ``skipped_manifests``:
                                       ``[{"file", "reason"}]`` of shards that could not be read),
                                       preview choices and bounds
``POST /api/preview``                  JSON ``{"class": id|name, "shift", "seed", "scales"?}`` ->
                                       per-scale image (base64 data URL), filter scores + keep
                                       decision, each classifier's top-1/top-5/p_true/correct,
                                       and the failure point of each classifier
``GET /api/preview/strip.png``         ``?class=&shift=&seed=&scales=0,0.5,...``: the images as one PNG
``GET /api/benchmarks/shifts``         shifts of the build with trajectory counts
``GET /api/benchmarks/classes``        ``?shift=``: classes (of that shift) with counts
``GET /api/benchmarks/trajectories``   ``?shift=&class_id=``: trajectories, samples ordered by
                                       scale (kept flag, scores, per-classifier prediction), and
                                       per-classifier failure points of complete trajectories
``GET /api/benchmarks/image/{id}``     the stored image of a sample id (PNG or JPEG)
``GET /api/report``                    ``report/metrics.json``
``GET /report/{file}``                 a file of ``report/`` (plots, CSVs, index.html)
``GET /review``, ``/api/review/...``   review of a mined set (:mod:`pipeline.serve.review_api`)

Errors are JSON ``{"detail": ...}``; an unknown class or shift is a 404 whose body also
holds ``"choices"``.  Bad input is rejected before it reaches a model: 422 for invalid
values (wrong JSON types; scales outside ``[lo, hi]`` = the build's scale range times
``scale_bound_factor``; more than ``max_preview_scales`` scales; seed outside
``0..2**31-1``), 400 for a body that is not JSON or is nested too deeply to parse, 415
for a preview POST that is not ``application/json``, 413 for a body over
``max_body_bytes`` (16 KiB), 431 for request headers over 16 KiB (before the token is
checked).  Images are served only for sample ids present in the samples index and report
files only by names listed in ``report/``: no filesystem path is ever built from request
input.  While the output is being replaced (``build --new-version`` moves the old build
under ``previous/`` and writes the new one) a file the index still lists is answered 503
with ``Retry-After``; once the index has reloaded, what is gone is 404.  An unexpected
error is a JSON 500 naming it, never a traceback.

Security
--------
With a token (``token`` arg / ``--token`` / ``$CNSBENCH_API_TOKEN``), every path except
``/`` and ``/healthz`` needs ``Authorization: Bearer <token>`` (401 otherwise); the page
asks for the token and sends it with every request.  ``run_server`` binds 127.0.0.1
unless told otherwise, and on a loopback address only accepts loopback ``Host`` headers
(DNS-rebinding guard).  The page is served with a strict Content-Security-Policy (its
one script pinned by hash, no external origin).

Importing the package does not import Ray or torch.
"""

from pipeline.serve.deployments import build_app, in_process_api, make_app
from pipeline.serve.index import BenchmarkIndex
from pipeline.serve.launch import run_server
from pipeline.serve.options import ServeOptions, deployment_options

__all__ = [
    "BenchmarkIndex",
    "ServeOptions",
    "build_app",
    "deployment_options",
    "in_process_api",
    "make_app",
    "run_server",
]
