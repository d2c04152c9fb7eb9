"""The ingress's HTTP API: routes, request validation, error answers, and the web page.

:func:`make_api` builds the FastAPI app over a :class:`~pipeline.serve.index.BenchmarkIndex`
(benchmark browser) and a :class:`~pipeline.serve.preview.PreviewService` (live preview),
either of which may be absent; see :mod:`pipeline.serve` for the endpoints.  Malformed
requests are answered 400 (body not JSON, nested too deeply to parse), 413, 415 or 422
(values of the wrong type or out of bounds) before anything reaches a model.

The web page lives in ``static/`` (``index.html``, ``app.css``, ``app.js``, package
data); :func:`page` inlines the style and script into the HTML, so the page is one
response that needs no token, and its Content-Security-Policy pins the script by hash.
"""

# No `from __future__ import annotations`: FastAPI resolves the route signatures inside
# make_api() at definition time, and their types are imported there, not globally.

import functools
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pipeline.serve.errors import BadBody, InvalidRequest, NotFound, OutputReplaced, PreviewFailed, json_body
from pipeline.serve.middleware import BearerAuth, BodyLimit, HeaderLimit, SecurityHeaders
from pipeline.serve.options import APP_NAME
from pipeline.serve.pages import inline_page
from pipeline.serve.preview import PreviewResult, parse_preview, strip_png

if TYPE_CHECKING:
    from fastapi import FastAPI

    from pipeline.serve.index import BenchmarkIndex
    from pipeline.serve.preview import PreviewService

log = logging.getLogger(__name__)



@functools.lru_cache(maxsize=1)
def page() -> tuple[str, str]:
    """(HTML, Content-Security-Policy) of the web page (``static/index.html`` with ``app.css`` and
    ``app.js`` inlined, :func:`pipeline.serve.pages.inline_page`), read once."""
    return inline_page("index.html", "app.js", "app.css")


def make_api(
    index: "BenchmarkIndex | None",
    preview: "PreviewService | None",
    *,
    token: str | None = None,
    max_body_bytes: int = 16 * 1024,
    max_header_bytes: int = 16 * 1024,
    allowed_hosts: Sequence[str] | None = None,
) -> "FastAPI":
    """The FastAPI app of the ingress (see :mod:`pipeline.serve` for the endpoints)."""
    from fastapi import FastAPI, Query, Request
    from fastapi.responses import HTMLResponse, JSONResponse, Response

    app = FastAPI(title="cnsbench", docs_url=None, redoc_url=None, openapi_url="/api/openapi.json")

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, err: NotFound) -> JSONResponse:
        return JSONResponse({"detail": err.message, "choices": err.choices}, status_code=404)

    @app.exception_handler(PreviewFailed)
    async def _failed(_: Request, err: PreviewFailed) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=500)

    @app.exception_handler(BadBody)
    async def _bad_body(_: Request, err: BadBody) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=err.status)

    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, err: InvalidRequest) -> JSONResponse:
        return JSONResponse({"detail": err.errors}, status_code=422)

    @app.exception_handler(OutputReplaced)
    async def _replaced(_: Request, err: OutputReplaced) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=503, headers={"retry-after": str(int(err.retry_after_s + 0.999))})

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception) -> JSONResponse:
        # The traceback goes to the log; the client gets one line in JSON.
        log.error("%s %s failed", request.method, request.url.path, exc_info=err)
        first = str(err).splitlines()[0][:200] if str(err) else ""
        return JSONResponse({"detail": f"internal error: {type(err).__name__}: {first}"}, status_code=500)

    def need_index() -> "BenchmarkIndex":
        if index is None:
            raise NotFound("no benchmark loaded: start the server with --output DIR")
        return index

    def need_preview() -> "PreviewService":
        if preview is None:
            raise NotFound("live preview is off: start the server with --config CONFIG")
        return preview

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/", response_class=HTMLResponse)
    def index_page() -> HTMLResponse:
        html, csp = page()
        return HTMLResponse(html, headers={"content-security-policy": csp, "cache-control": "no-cache"})

    @app.get("/api/info")
    def api_info() -> dict[str, Any]:
        bench = index.info() if index else None
        prev = preview.describe() if preview else None
        same = None
        if bench and prev:
            same = bench["config_hash"] == prev["config_hash"]
        return {"app": APP_NAME, "benchmark": bench, "preview": prev, "same_config": same}

    async def run_preview(data: Any) -> PreviewResult:
        svc = need_preview()
        req = parse_preview(data, svc.bounds)
        try:
            return await svc.run(req)
        except (NotFound, InvalidRequest):
            raise
        except Exception as err:
            # Serve's own overload errors keep their 503 handlers; anything else is a model failure.
            from ray.serve.exceptions import (
                BackPressureError,
                DeploymentUnavailableError,
            )

            if isinstance(err, (BackPressureError, DeploymentUnavailableError)):
                raise
            log.exception("preview failed")
            raise PreviewFailed(f"preview failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}") from err

    @app.post("/api/preview")
    async def api_preview(request: Request) -> Response:
        need_preview()
        return JSONResponse((await run_preview(await json_body(request))).to_json())

    @app.get("/api/preview/strip.png")
    async def api_preview_strip(request: Request) -> Response:
        need_preview()
        q = request.query_params
        unknown = sorted(set(q) - {"class", "shift", "seed", "scales"})
        if unknown:
            raise InvalidRequest([{"loc": ["query", k], "msg": "unknown parameter", "type": "extra_forbidden"} for k in unknown])
        data: dict[str, Any] = {k: q[k] for k in ("class", "shift", "seed") if k in q}
        if "scales" in q:
            try:
                data["scales"] = [float(s) for s in q["scales"].split(",") if s.strip()]
            except ValueError:
                raise InvalidRequest([{"loc": ["query", "scales"], "msg": "comma-separated numbers", "type": "float_parsing"}]) from None
        result = await run_preview(data)
        return Response(strip_png(result.images), media_type="image/png")

    @app.get("/api/benchmarks/shifts")
    def api_shifts() -> dict[str, Any]:
        return need_index().shifts()

    @app.get("/api/benchmarks/classes")
    def api_classes(shift: str | None = Query(None, max_length=100)) -> dict[str, Any]:
        return need_index().classes(shift)

    @app.get("/api/benchmarks/trajectories")
    def api_trajectories(
        shift: str = Query(..., max_length=100), class_id: int = Query(..., ge=0, le=10**9)
    ) -> dict[str, Any]:
        return need_index().trajectories(shift, class_id)

    @app.get("/api/benchmarks/image/{sample_id:path}")
    def api_image(sample_id: str) -> Response:
        found = need_index().image(sample_id)
        if found is None:
            # No choices here: the list of every sample id is not an error message.
            return JSONResponse({"detail": "unknown sample id"}, status_code=404)
        data, mime = found
        return Response(data, media_type=mime, headers={"cache-control": "private, max-age=3600"})

    @app.get("/api/report")
    def api_report() -> Response:
        return Response(need_index().report_metrics(), media_type="application/json")

    @app.get("/report/{name}")
    def report_file(name: str) -> Response:
        data, mime = need_index().report_file(name)
        headers = {"content-security-policy": "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'"}
        return Response(data, media_type=mime, headers=headers)

    from pipeline.serve.review_api import add_review_routes

    add_review_routes(app, need_index)

    # Starlette runs the last added middleware first: the header limit, hosts, auth, the body limit.
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(BearerAuth, token=token)
    app.add_middleware(SecurityHeaders)
    if allowed_hosts:
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    app.add_middleware(HeaderLimit, max_bytes=max_header_bytes)
    return app
