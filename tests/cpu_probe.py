"""Per-module CPU of the test suite (a pytest plugin for measuring it, not used by the suite).

    PYTHONPATH=tests python -m pytest -q -n 3 -p cpu_probe -p no:cacheprovider

A thread samples every 0.5 s the user+system CPU of the test worker and of every process
under it (Ray, subprocess builds); each increase is charged to the module running then.
Each worker writes ``cpu_probe.<worker>.tsv`` (module, CPU-seconds, wall seconds) into
``$CNSBENCH_CPU_PROBE_DIR`` (default: the temporary directory).  The CPU a process spends
in its last half second is missed.  ``CNSBENCH_CPU_PROBE_BY=test`` charges each test instead
of each module.  Under xdist the controller writes ``cpu_probe.main.tsv`` too, which counts
its workers again: add up the ``gw*`` files."""
import os
import tempfile
import threading
import time

import psutil

_mod = {"name": "(collect)"}
_acc, _wall = {}, {}
_last = {}
_stop = threading.Event()

def _sample():
    me = psutil.Process()
    procs = [me]
    try:
        procs += me.children(recursive=True)
    except Exception:
        pass
    m = _mod["name"]
    for p in procs:
        try:
            ct = p.cpu_times()
            v = ct.user + ct.system
            key = (p.pid, p.create_time())
        except Exception:
            continue
        d = v - _last.get(key, 0.0)
        if d > 0:
            _acc[m] = _acc.get(m, 0.0) + d
            _last[key] = v

def _loop():
    t = time.time()
    while not _stop.is_set():
        _sample()
        now = time.time()
        _wall[_mod["name"]] = _wall.get(_mod["name"], 0.0) + now - t
        t = now
        _stop.wait(0.5)

def pytest_sessionstart(session):
    threading.Thread(target=_loop, daemon=True).start()

_BY_TEST = os.environ.get("CNSBENCH_CPU_PROBE_BY") == "test"


def pytest_runtest_setup(item):
    name = item.nodeid if _BY_TEST else item.module.__name__
    if _mod["name"] != name:
        _sample()
        _mod["name"] = name

def pytest_sessionfinish(session):
    _sample(); _stop.set()
    wid = os.environ.get("PYTEST_XDIST_WORKER", "main")
    out = os.environ.get("CNSBENCH_CPU_PROBE_DIR", tempfile.gettempdir())
    with open(os.path.join(out, f"cpu_probe.{wid}.tsv"), "w") as f:
        for m, v in sorted(_acc.items(), key=lambda kv: -kv[1]):
            f.write(f"{m}\t{v:.1f}\t{_wall.get(m, 0):.1f}\n")
