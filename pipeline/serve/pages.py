"""The web app's pages: a static HTML file of the package with its script (and style) inlined,
and the Content-Security-Policy that lets exactly that script run.

The HTML links its script and style (``<script src="app.js">``, ``<link rel="stylesheet"
href="app.css">``) so the files also open as they are; each link must stand exactly once and
is replaced by the file's contents.  The policy allows that one inline script (pinned by its
SHA-256), inline styles, and nothing from another origin.
"""

from __future__ import annotations

import base64
import hashlib
from importlib import resources

STATIC = "pipeline/serve/static"


def inline_page(html_name: str, script_name: str, style_name: str | None = None) -> tuple[str, str]:
    """(HTML, Content-Security-Policy) of the page ``html_name`` of ``static/`` with ``script_name`` (and
    ``style_name``) inlined; RuntimeError naming the file when a link is missing or doubled,
    or when a file would close its own inline element."""
    static = resources.files("pipeline.serve") / "static"
    html = (static / html_name).read_text(encoding="utf-8")
    script = (static / script_name).read_text(encoding="utf-8")
    inlined = {f'<script src="{script_name}"></script>': f"<script>{script}</script>"}
    if "</script" in script.lower():
        raise RuntimeError(f"{STATIC}/{script_name} must not close its own inline element")
    if style_name is not None:
        style = (static / style_name).read_text(encoding="utf-8")
        if "</style" in style.lower():
            raise RuntimeError(f"{STATIC}/{style_name} must not close its own inline element")
        inlined = {f'<link rel="stylesheet" href="{style_name}">': f"<style>{style}</style>", **inlined}
    for link, inline in inlined.items():
        if html.count(link) != 1:
            raise RuntimeError(f"{STATIC}/{html_name} must contain {link!r} exactly once")
        html = html.replace(link, inline)
    digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode()
    csp = (
        "default-src 'none'; "
        f"script-src 'sha256-{digest}'; "
        "style-src 'unsafe-inline'; img-src 'self' data: blob:; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return html, csp
