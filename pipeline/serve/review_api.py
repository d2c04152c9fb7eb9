"""Routes of the review view: keyboard-driven accept / reject / "not the class" of a mined set.

``GET /review``                              the review page (``static/review.html`` + ``review.js``,
                                             inlined like the main page; ``?set=hard_set``)
``GET /api/review/{set}/items``              the set's images, coordinates, current decisions, progress
``POST /api/review/{set}/decisions``         JSON ``{"decisions": {sample_id: "accept"|"reject"|"not_class"|null}}``
                                             -> progress; stored in ``review/<set>.json`` of the output
``GET /api/review/{set}/progress``           counts per decision, decided and remaining

Decisions live in :mod:`pipeline.serve.review` (atomic, resumable; final set = mined ∩
accepted).  An unknown set is 404, a malformed body 400, a non-JSON POST 415, and an
unknown sample id or decision 422; images come from ``/api/benchmarks/image/{id}``.
"""

# No `from __future__ import annotations`: FastAPI resolves the route signatures at definition time.

import functools
from typing import Any, Callable

from pipeline.serve.errors import InvalidRequest, NotFound, json_body
from pipeline.serve.pages import inline_page



@functools.lru_cache(maxsize=1)
def review_page() -> tuple[str, str]:
    """(HTML, Content-Security-Policy) of the review page (``static/review.html`` with ``review.js``
    inlined, :func:`pipeline.serve.pages.inline_page`), read once."""
    return inline_page("review.html", "review.js")


def add_review_routes(app: Any, need_index: Callable[[], Any]) -> None:
    """Register the review routes on ``app`` (the ingress); ``need_index()`` gives the BenchmarkIndex."""
    from fastapi import Request
    from fastapi.responses import HTMLResponse, JSONResponse, Response

    from pipeline.serve.review import Review, ReviewError, UnknownSet

    def review() -> Review:
        return Review(need_index().store)

    def checked(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except UnknownSet as err:
            raise NotFound(str(err), review().sets()) from None
        except ReviewError as err:
            raise InvalidRequest(str(err)) from None

    @app.get("/review", response_class=HTMLResponse)
    def review_html() -> HTMLResponse:
        html, csp = review_page()
        return HTMLResponse(html, headers={"content-security-policy": csp, "cache-control": "no-cache"})

    @app.get("/api/review/{name}/items")
    def review_items(name: str) -> dict[str, Any]:
        r = review()
        return checked(lambda: {"set": name, "items": r.items(name), "progress": r.progress(name)})

    @app.get("/api/review/{name}/progress")
    def review_progress(name: str) -> dict[str, Any]:
        return checked(lambda: review().progress(name))

    @app.post("/api/review/{name}/decisions")
    async def review_decide(name: str, request: Request) -> Response:
        data = await json_body(request)
        if not isinstance(data, dict) or set(data) != {"decisions"} or not isinstance(data["decisions"], dict):
            raise InvalidRequest('body must be {"decisions": {sample_id: "accept" | "reject" | "not_class" | null}}')
        return JSONResponse(checked(lambda: review().decide(name, data["decisions"])))
