"""The web page of the Serve app in a real browser: headless Chromium driven over CDP.

Debian's ``chromium`` package is needed (``apt-get install -y chromium``); without
``/usr/bin/chromium`` the module is skipped.  No Selenium or WebDriver: Chromium speaks the
DevTools protocol on a pipe (``--remote-debugging-pipe``: commands on fd 3, replies on
fd 4, NUL-terminated JSON), which :class:`Chromium` below implements in a few lines.

The page is loaded from the app on 127.0.0.1 (the same tiny benchmark as
``test_serve.py``, with a token; its in-process ingress served by uvicorn, no Ray), the
token entered in its form, a shift selected, and the DOM checked after the page's
JavaScript ran: one row per trajectory with its images decoded, filtered-out images
greyed, each classifier's failure point marked on the right image, the report's plots,
and a live preview generated from the preview panel.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from test_serve import (
    TOKEN,
    build_benchmark,
    http_server,
    local_ingress,
    read_dir,
)

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium: apt-get update && apt-get install -y chromium"
    ),
]

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--remote-debugging-pipe",
]


class Chromium:
    """Headless Chromium with one page, controlled over the DevTools pipe."""

    def __init__(self, user_data_dir: Path, log_path: Path) -> None:
        cmd_r, cmd_w = os.pipe()  # we write commands -> Chromium reads them on fd 3
        out_r, out_w = os.pipe()  # Chromium writes replies on fd 4 -> we read them
        # The child's ends move above 4 so that placing them on 3 and 4 cannot clobber them;
        # bash does the placing (no preexec_fn, unsafe with threads; dash only knows fds 0-9).
        child_in = fcntl.fcntl(cmd_r, fcntl.F_DUPFD_CLOEXEC, 10)
        child_out = fcntl.fcntl(out_w, fcntl.F_DUPFD_CLOEXEC, 10)
        for fd in (cmd_r, out_w):
            os.close(fd)
        wire = f'exec "$0" "$@" 3<&{child_in} 4>&{child_out} {child_in}<&- {child_out}>&-'
        self._log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", wire, str(CHROMIUM), *FLAGS, f"--user-data-dir={user_data_dir}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            pass_fds=(child_in, child_out),
        )
        os.close(child_in)
        os.close(child_out)
        self._w = cmd_w
        self._r = out_r
        self._next = 0
        self._replies: dict[int, queue.Queue] = {}
        self._lock = threading.Lock()
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.session = self._attach()

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._r, 1 << 16)
            except OSError:
                return
            if not chunk:
                return
            buf += chunk
            while b"\0" in buf:
                raw, buf = buf.split(b"\0", 1)
                msg = json.loads(raw)
                if "id" in msg:
                    with self._lock:
                        q = self._replies.get(msg["id"])
                    if q is not None:
                        q.put(msg)
                else:
                    self.events.append(msg)

    def send(self, method: str, params: dict[str, Any] | None = None, session: bool = True, timeout: float = 60) -> Any:
        with self._lock:
            self._next += 1
            mid = self._next
            q: queue.Queue = queue.Queue()
            self._replies[mid] = q
        msg: dict[str, Any] = {"id": mid, "method": method, "params": params or {}}
        if session and getattr(self, "session", None):
            msg["sessionId"] = self.session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        try:
            reply = q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"no reply to {method} within {timeout} s") from None
        if "error" in reply:
            raise RuntimeError(f"{method}: {reply['error']}")
        return reply["result"]

    def _attach(self) -> str:
        deadline = time.time() + 30
        while True:
            try:
                targets = self.send("Target.getTargets", session=False, timeout=30)["targetInfos"]
            except TimeoutError:
                self._log.flush()
                tail = self._log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"Chromium does not answer on its DevTools pipe; its log:\n{tail}") from None
            pages = [t for t in targets if t["type"] == "page"]
            if pages or time.time() > deadline:
                break
            time.sleep(0.2)
        assert pages, "Chromium opened no page"
        sid = self.send("Target.attachToTarget", {"targetId": pages[0]["targetId"], "flatten": True}, session=False)
        self.session = sid["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable")
        return self.session

    def js(self, expression: str) -> Any:
        """Evaluate in the page (promises awaited); returns the JSON value."""
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in r:
            raise RuntimeError(f"JS error in {expression!r}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60, what: str = "") -> Any:
        deadline = time.time() + timeout
        while True:
            try:
                value = self.js(expression)
            except RuntimeError:  # the page is still loading (about:blank has no such elements)
                value = None
            if value:
                return value
            if time.time() > deadline:
                status = self.js("document.querySelector('#status') && document.querySelector('#status').textContent")
                raise AssertionError(f"timed out waiting for {what or expression} (page status: {status!r}); {self.problems()}")
            time.sleep(0.2)

    def problems(self) -> list[str]:
        """Uncaught JS exceptions and console errors other than network ones (e.g. CSP violations)."""
        out = []
        for e in self.events:
            if e.get("method") == "Runtime.exceptionThrown":
                out.append(json.dumps(e["params"]["exceptionDetails"])[:500])
            elif e.get("method") == "Log.entryAdded":
                entry = e["params"]["entry"]
                if entry["level"] == "error" and entry["source"] != "network":
                    out.append(f"{entry['source']}: {entry['text']}")
        return out

    def close(self) -> None:
        try:
            self.send("Browser.close", session=False, timeout=10)
        except (RuntimeError, TimeoutError, OSError):
            pass  # already gone; the process is reaped below either way
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._w, self._r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._log.close()


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """(URL, build output) of the app on the tiny benchmark (built by test_serve.py or here)."""
    cfg_path, out = build_benchmark(tmp_path_factory)
    with http_server(local_ingress(cfg_path, out, TOKEN).__serve_build_asgi_app__()) as url:
        yield url, out


@pytest.fixture()
def browser(tmp_path):
    b = Chromium(tmp_path / "profile", tmp_path / "chromium.log")
    yield b
    b.close()


IMAGES_LOADED = """(() => {
  const box = document.querySelector('#trajectories');
  if (box.dataset.state !== 'ready' || box.dataset.shift !== %s) return false;
  const imgs = [...box.querySelectorAll('img.sample')];
  return imgs.length > 0 && imgs.every(i => i.complete && i.naturalWidth > 0);
})()"""

PAGE_STATE = """(() => [...document.querySelectorAll('#trajectories .traj')].map(row => ({
  id: row.dataset.trajectory,
  complete: !row.classList.contains('incomplete'),
  cells: [...row.querySelectorAll('figure.cell')].map(f => {
    const img = f.querySelector('img.sample');
    return {
      scale: Number(f.dataset.scale),
      sample: img.dataset.sample,
      width: img.naturalWidth,
      blob: img.src.startsWith('blob:'),
      filtered: f.classList.contains('filtered'),
      grey: getComputedStyle(img).filter,
      failing: f.dataset.failing ? f.dataset.failing.split(',') : [],
      badges: [...f.querySelectorAll('.badge')].map(b => b.dataset.classifier),
      ring: f.querySelector('.frame').style.boxShadow,
    };
  }),
})))()"""


def test_page_shows_trajectories_failure_points_report_and_preview(app, browser):
    app_url, out = app
    samples, preds = read_dir(out, "samples"), read_dir(out, "predictions")
    classifiers = list(dict.fromkeys(preds["classifier"]))

    browser.send("Page.navigate", {"url": app_url})
    # With a token the page first asks for it ...
    browser.wait_for("!document.querySelector('#token-form').hidden", what="the token form")
    browser.js("document.querySelector('#token').focus()")
    browser.send("Input.insertText", {"text": TOKEN})
    browser.js("document.querySelector('#token-form button').click()")
    browser.wait_for("document.body.dataset.ready === '1' && !document.querySelector('#browse').hidden", what="the page")
    assert browser.js("getComputedStyle(document.querySelector('#token-form')).display") == "none"
    legend = browser.js("document.querySelector('#legend').innerText")
    assert all(name in legend for name in classifiers) and "[object" not in browser.js("document.body.innerText")

    # ... then shows the first shift; select the other one as a user would.
    shifts = browser.js("[...document.querySelectorAll('#shift option')].map(o => o.value)")
    assert shifts == sorted(samples["shift"].unique())
    shift = shifts[-1]
    assert browser.js("document.querySelector('#shift').value") != shift
    browser.js(
        f"(() => {{ const s = document.querySelector('#shift'); s.value = {json.dumps(shift)};"
        " s.dispatchEvent(new Event('change')); })()"
    )
    browser.wait_for(IMAGES_LOADED % json.dumps(shift), what=f"the images of {shift}")

    rows = browser.js(PAGE_STATE)
    sub = samples[samples["shift"] == shift]
    assert sorted(r["id"] for r in rows) == sorted(sub["trajectory_id"].unique())
    g = sub.groupby("trajectory_id")
    complete = set(g.size()[(g.size() == 6) & g["kept"].all()].index)
    merged = preds.merge(sub[["sample_id", "trajectory_id", "scale"]], on="sample_id")
    n_rings = 0
    for row in rows:
        tid = row["id"]
        trows = sub[sub["trajectory_id"] == tid].sort_values("scale")
        assert [c["sample"] for c in row["cells"]] == trows["sample_id"].tolist()
        assert all(c["width"] == 64 and c["blob"] for c in row["cells"]), "every image decoded (fetched with the token)"
        assert [c["filtered"] for c in row["cells"]] == (~trows["kept"]).tolist()
        for c in row["cells"]:
            assert ("grayscale" in c["grey"]) == c["filtered"]  # filtered-out images are greyed
        assert row["complete"] == (tid in complete)
        for c in row["cells"]:
            expected = []
            if tid in complete:  # failure points count on complete trajectories only
                for name in classifiers:
                    m = merged[(merged["trajectory_id"] == tid) & (merged["classifier"] == name)]
                    wrong = m.loc[~m["correct"], "scale"]
                    if len(wrong) and float(wrong.min()) == c["scale"]:
                        expected.append(name)
            assert c["failing"] == expected and c["badges"] == expected, (tid, c["scale"])
            assert bool(c["ring"]) == bool(expected)
            n_rings += bool(expected)
    assert n_rings > 0

    # the report: summary table and the three plots, fetched with the token
    plots = browser.wait_for(
        "(() => { const p = [...document.querySelectorAll('#plots img.plot')];"
        " return p.length && p.every(i => i.complete && i.naturalWidth > 0) && p.map(i => i.dataset.file); })()",
        what="the report plots",
    )
    expected_plots = sorted(p.name for p in (out / "report").glob("*.png"))
    assert "accuracy_drop.png" in expected_plots and sorted(plots) == expected_plots
    assert browser.js("document.querySelectorAll('#summary tr').length") == 1 + len(classifiers)

    # the live preview panel: generate a trajectory that is not in the benchmark
    assert not browser.js("document.querySelector('#preview').hidden")
    browser.js(
        "(() => { document.querySelector('#pv-class').value = '22';"
        " document.querySelector('#pv-shift').value = 'heavy_snow';"
        " document.querySelector('#pv-seed').value = '777';"
        " document.querySelector('#pv-scales').value = '0, 1, 2';"
        " document.querySelector('#pv-run').click(); })()"
    )
    preview = browser.wait_for(
        "(() => { const o = document.querySelector('#preview-out'); if (o.dataset.state !== 'ready') return false;"
        " const imgs = [...o.querySelectorAll('img.sample')];"
        " return imgs.every(i => i.complete && i.naturalWidth > 0) && imgs.map(i => i.dataset.sample); })()",
        timeout=120,
        what="the preview",
    )
    assert preview == [f"heavy_snow/022/seed_0777_scale_{t}" for t in ("0000", "1000", "2000")]
    assert browser.problems() == []


def test_bad_preview_input_is_reported_on_the_page(app, browser):
    browser.send("Page.navigate", {"url": app[0]})
    browser.wait_for("!document.querySelector('#token-form').hidden", what="the token form")
    browser.js(f"document.querySelector('#token').value = {json.dumps(TOKEN)}")
    browser.js("document.querySelector('#token-form button').click()")
    browser.wait_for("document.body.dataset.ready === '1' && !document.querySelector('#preview').hidden")
    browser.js("document.querySelector('#pv-scales').value = '0, 99'; document.querySelector('#pv-run').click()")
    status = browser.wait_for(
        "document.querySelector('#preview-out').dataset.state === 'error' && document.querySelector('#status').textContent",
        what="the error message",
    )
    assert status.startswith("422") and "scales must lie in [0, 5]" in status
