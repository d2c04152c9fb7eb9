"""The review view in headless Chromium: keyboard decisions are stored, and a reload keeps them.

Uses the DevTools-pipe driver of ``test_serve_browser.py`` (skipped without
``/usr/bin/chromium``) and the small evaluate output with a hand-made hard set of
``test_imagenet_d_review.py``, served in process by uvicorn with a token.
"""

from __future__ import annotations

import json

import pytest
from test_imagenet_d_review import output  # noqa: F401  (module fixture: the reviewed output)
from test_serve import TOKEN, http_server
from test_serve_browser import CHROMIUM, Chromium

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium: apt-get install -y chromium"),
]

GRID = """(() => [...document.querySelectorAll('#grid .item')].map(el => ({
  id: el.dataset.sampleId, decision: el.dataset.decision || null, focus: el.classList.contains('focus'),
  loaded: el.querySelector('img').complete && el.querySelector('img').naturalWidth > 0,
})))()"""


def press(browser: Chromium, key: str) -> None:
    codes = {"ArrowRight": 39, "ArrowLeft": 37}
    vk = codes[key] if key in codes else ord(key.upper())
    event = {"key": key, "code": key if key in codes else f"Key{key.upper()}", "windowsVirtualKeyCode": vk}
    browser.send("Input.dispatchKeyEvent", {"type": "keyDown", **event, **({} if key in codes else {"text": key})})
    browser.send("Input.dispatchKeyEvent", {"type": "keyUp", **event})


def test_review_by_keyboard_persists_across_reload(output, tmp_path):  # noqa: F811
    from pipeline.serve.deployments import in_process_ingress

    import shutil

    shutil.rmtree(output / "review", ignore_errors=True)
    app = in_process_ingress({"output": str(output), "token": TOKEN, "allowed_hosts": ["127.0.0.1"]})
    browser = Chromium(tmp_path / "profile", tmp_path / "chromium.log")
    try:
        with http_server(app.__serve_build_asgi_app__()) as url:
            browser.send("Page.navigate", {"url": url + "review?set=hard_set"})
            browser.wait_for("!document.querySelector('#token-form').hidden", what="the token form")
            browser.js("document.querySelector('#token').focus()")
            browser.send("Input.insertText", {"text": TOKEN})
            browser.js("document.querySelector('#token-form button').click()")
            browser.wait_for(f"(() => {{ const g = {GRID}; return g.length === 3 && g.every(c => c.loaded); }})()", what="the grid")
            grid = browser.js(GRID)
            assert grid[0]["focus"] and all(c["decision"] is None for c in grid)

            press(browser, "a")  # accept the first; focus moves on
            browser.wait_for("document.querySelector('#progress').dataset.decided === '1'", what="the first decision")
            press(browser, "n")  # the second is not its class
            browser.wait_for("document.querySelector('#progress').dataset.decided === '2'", what="the second decision")
            press(browser, "ArrowLeft")
            press(browser, "u")  # undo the second
            browser.wait_for("document.querySelector('#progress').dataset.decided === '1'", what="the undo")
            press(browser, "r")  # and reject it instead
            browser.wait_for("document.querySelector('#progress').dataset.decided === '2'", what="the reject")
            expected = [grid[0]["id"], grid[1]["id"]]
            assert [c["decision"] for c in browser.js(GRID)] == ["accept", "reject", None]

            stored = json.loads((output / "review" / "hard_set.json").read_text())["decisions"]
            assert {k: v["decision"] for k, v in stored.items()} == {expected[0]: "accept", expected[1]: "reject"}

            # A reload (same tab, token in sessionStorage) shows the stored decisions.
            browser.send("Page.reload")
            browser.wait_for(f"(() => {{ const g = {GRID}; return g.length === 3 && g[0].decision === 'accept'; }})()", what="the reloaded grid")
            assert [c["decision"] for c in browser.js(GRID)] == ["accept", "reject", None]
            assert browser.js(GRID)[2]["focus"]  # focus starts at the first undecided image
            assert not browser.problems()
    finally:
        browser.close()
