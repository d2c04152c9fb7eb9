"""The import path ``pipeline.serve.app:build_app`` of the Serve application.

Named by ``serve run``, ``deploy/serve.yaml`` and ``deploy/kuberay/rayservice.yaml``;
the code lives in the modules of :mod:`pipeline.serve`, whose public names this module
re-exports for callers of the former single-module layout.
"""

from pipeline.serve.api import make_api, page
from pipeline.serve.deployments import (
    Ingress,
    LocalHandle,
    PreviewClassifier,
    PreviewGenerator,
    build_app,
    generate_row,
    in_process_api,
    in_process_ingress,
    make_app,
)
from pipeline.serve.errors import InvalidRequest, NotFound, PreviewFailed
from pipeline.serve.index import BenchmarkIndex
from pipeline.serve.launch import run_server
from pipeline.serve.middleware import BearerAuth, BodyLimit, SecurityHeaders
from pipeline.serve.options import (
    APP_NAME,
    DEFAULT_HOST,
    DEFAULT_PORT,
    MAX_SEED,
    TOKEN_ENV,
    ServeOptions,
    deployment_options,
)
from pipeline.serve.preview import (
    PreviewBounds,
    PreviewRequest,
    PreviewResult,
    PreviewService,
    normalize_scales,
    parse_preview,
    strip_png,
)

__all__ = [
    "APP_NAME",
    "DEFAULT_HOST",
    "DEFAULT_PORT",
    "MAX_SEED",
    "TOKEN_ENV",
    "BearerAuth",
    "BenchmarkIndex",
    "BodyLimit",
    "Ingress",
    "InvalidRequest",
    "LocalHandle",
    "NotFound",
    "PreviewBounds",
    "PreviewClassifier",
    "PreviewFailed",
    "PreviewGenerator",
    "PreviewRequest",
    "PreviewResult",
    "PreviewService",
    "SecurityHeaders",
    "ServeOptions",
    "build_app",
    "deployment_options",
    "generate_row",
    "in_process_api",
    "in_process_ingress",
    "make_api",
    "make_app",
    "normalize_scales",
    "page",
    "parse_preview",
    "run_server",
    "strip_png",
]
