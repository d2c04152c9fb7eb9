"""The test suite's tiers by cost, chosen from what each test uses (tests/conftest.py marks them).

- ``unit``: no Ray, no build, no subprocess, no model beyond the tiny random ones (the tiny
  config's assets, made once per checkout in seconds: ``ensure_tiny_assets``).  A guard (:func:`guard`) makes ``ray.init``, ``OutputRun.claim`` (every build,
  evaluate, refine and card run claims its output) and subprocess builds fail there.
- ``integration``: in-process builds, the session's tiny and demo builds (``tiny_sd``,
  ``tiny_world``, ``tiny_reference``, ``demo_world``), forked builds, other subprocesses.
- ``cluster``: Ray (``ray_session``, a build on the Ray runner, Serve), ``ray start`` and the
  fake autoscaling clusters, the family worlds' builds, the benches' smoke runs, the browser.

A test's tier is the highest that the source of the test, of every fixture it requests
(directly or through other fixtures) and of the test-side helpers those call (functions of
the test modules, ``buildproc``, ``hostile``, ...) asks for, by the patterns below.  So a new
test lands in its tier without a marker.  A ``pytest.mark.unit`` / ``integration`` / ``cluster``
on a test or module says it outright; MODULE_FLOOR raises the modules whose cost inspection
cannot see.
"""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
import types
from pathlib import Path
from typing import Any, Callable, Iterator

TIERS = ("unit", "integration", "cluster")
TESTS = Path(__file__).resolve().parent

# Patterns in a test's sources (test function, fixtures, test-side helpers) and the tier each asks for.
PATTERNS: dict[str, tuple[str, ...]] = {
    "cluster": (
        r"\bray\.init\(", r"\bray_session\b", r"\bfrom ray import serve\b", r"\bserve\.run\(",
        r"\b(Autoscaling)?Cluster\(", r"\bRAY,\s*\"start\"",  # `ray start` clusters
        r"\"--runner\",\s*\"ray\"", r"runner=\"ray\"", r"\bkill_at\([^)]*\"ray\"",  # Ray builds
        r"\bplaywright\b", r"\bchromium\b",  # the browser
        r"\bBENCH\b", r"\"bench\"\s*/", r"load_script\(f?\"bench/",  # the benches' smoke runs
    ),
    "integration": (
        r"\bdemo_world\b", r"\btiny_reference\b", r"\btiny_sd\b", r"\btiny_world\b", r"\bbuild_sd2\(",
        r"\bbuild_here\(", r"\bshared_(build|output)\(",
        r"\bForkedBuild\(", r"\bkill_at\(", r"\.claim\(", r"from pipeline\.build import build\b",
        r"from pipeline\.cli\.(build|demo|evaluate|refine|card) import",  # a command's own parser, in process
        # A command run in process, unless the same line expects it to refuse (exit 1 or 2):
        # those are the argument checks' tests, and the guard stops one that runs after all.
        r"main\(\[\s*\"(build|demo|evaluate|refine|card|train-sliders|add-classifier|reclassify)\""
        r"(?![^\n]*(==\s*[12]\b|!=\s*0))",
        r"\bsubprocess\.(run|Popen|check_call|check_output)\(", r"\bsys\.executable\b",
    ),
}
_COMPILED = {tier: re.compile("|".join(p)) for tier, p in PATTERNS.items()}
# A family world's config in a function that builds it is a world build: cluster.
_WORLD = re.compile(r"world_[a-z_0-9]+\.yaml")
_BUILD = re.compile(r"\"build\"|\bbuild_here\(|\bbuild\(cfg\b")

# Modules whose cost the patterns cannot see: their tests build through a name that hides
# the command (a variable argv, a helper of the package).  Each is at least the given tier.
MODULE_FLOOR: dict[str, str] = {
    "test_card_world": "cluster",  # the four worlds' builds under the cards: configs from a table
    "test_chaos": "integration",  # bench/chaos.py's campaign forks and resumes builds in process
}


def rank(tier: str) -> int:
    return TIERS.index(tier)


def _test_side(obj: Any) -> bool:
    """Whether ``obj`` (a function, class or module) was defined in a file under tests/."""
    module = obj if isinstance(obj, types.ModuleType) else sys.modules.get(getattr(obj, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    return bool(path) and Path(path).resolve().is_relative_to(TESTS)


_NAME = re.compile(r"\b([A-Za-z_]\w*)(?:\.([A-Za-z_]\w*))?")
_cache: dict[Any, int] = {}


def _tier_of(obj: Any) -> int:
    """The tier rank that ``obj``'s source asks for, with the test-side functions it names."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if obj in _cache:
        return _cache[obj]
    try:
        src = inspect.getsource(obj)
    except (OSError, TypeError):
        return 0
    found = max((rank(t) for t, pat in _COMPILED.items() if pat.search(src)), default=0)
    if found == rank("integration") and _WORLD.search(src) and _BUILD.search(src):
        found = rank("cluster")
    _cache[obj] = found  # what a cycle back to ``obj`` sees
    if isinstance(obj, type):
        names = vars(sys.modules[obj.__module__])
    else:
        names = getattr(obj, "__globals__", {})
    for name, attr in set(_NAME.findall(src)):
        if found == len(TIERS) - 1:
            break
        target = names.get(name)
        if isinstance(target, types.ModuleType) and attr:
            target = getattr(target, attr, None) if _test_side(target) else None
        if (inspect.isfunction(target) or inspect.isclass(target)) and _test_side(target):
            found = max(found, _tier_of(target))
    _cache[obj] = found
    return found


def infer(item: Any) -> str:
    """The tier of a collected test: its own marker, else the highest its sources and its module's floor ask for."""
    for tier in reversed(TIERS):
        if item.get_closest_marker(tier) is not None:
            return tier
    found = _tier_of(getattr(item, "function", item.obj))
    for defs in item._fixtureinfo.name2fixturedefs.values():
        if defs and _test_side(defs[-1].func):
            found = max(found, _tier_of(defs[-1].func))
    floor = MODULE_FLOOR.get(Path(str(item.fspath)).stem)
    return TIERS[max(found, rank(floor) if floor else 0)]


class TierError(BaseException):
    """What the unit tier's guard raises: a BaseException, so no ``except Exception`` of the
    code under test turns it into an ordinary failure and hides the message."""


def _refuse(nodeid: str, what: str) -> Callable[..., Any]:
    def refuse(*_: Any, **__: Any) -> Any:
        raise TierError(f"{nodeid} is a unit test, and {what} is not for the unit tier: "
                        "give it a fixture or call that tests/tiers.py counts as integration or cluster, "
                        "or mark it pytest.mark.integration / pytest.mark.cluster")
    return refuse


_BUILDS = ("pipeline.cli", "cnsbench", "bench/", "bench\\", "scripts/test")


@contextlib.contextmanager
def guard(nodeid: str) -> Iterator[None]:
    """While a unit test runs: ``ray.init``, a claim of an output (``OutputRun.claim``: every
    build, evaluate, refine and card run starts with it) and a subprocess that runs a
    ``cnsbench`` command, a bench, ``scripts/test`` or ``ray`` raise :class:`TierError` naming
    the test.  A claim that the output's own checks refuse (a file where the output should
    be, another tool's marker, missing credentials) still raises their error: those are the
    checks' unit tests, and nothing runs after them."""
    import subprocess

    import ray

    from pipeline.output_run import OutputRun

    popen_init = subprocess.Popen.__init__
    claim = OutputRun.__dict__["claim"]

    def checked_popen(self: subprocess.Popen, args: Any, *rest: Any, **kw: Any) -> None:
        argv = [str(a) for a in ([args] if isinstance(args, (str, bytes, Path)) else args)]
        line = " ".join(argv)
        if any(b in line for b in _BUILDS) or (argv and Path(argv[0]).name == "ray"):
            _refuse(nodeid, f"the subprocess `{line[:120]}`")()
        popen_init(self, args, *rest, **kw)

    @contextlib.contextmanager
    def checked_claim(cls: type, *args: Any, **kw: Any) -> Iterator[Any]:
        with claim.__func__(cls, *args, **kw):  # the checks run; a refusal raises its own error
            _refuse(nodeid, "OutputRun.claim (a build or another run on an output)")()
        yield  # never reached

    saved_init = ray.init
    ray.init = _refuse(nodeid, "ray.init (a Ray session)")
    OutputRun.claim = classmethod(checked_claim)
    subprocess.Popen.__init__ = checked_popen
    try:
        yield
    finally:
        ray.init, OutputRun.claim, subprocess.Popen.__init__ = saved_init, claim, popen_init


def explain(obj: Any) -> list[str]:
    """What in ``obj``'s own source (a test or fixture function) the patterns match: why its tier."""
    src = inspect.getsource(inspect.unwrap(obj))
    return [m.group(0) for pat in (*_COMPILED.values(), _WORLD) for m in pat.finditer(src)]
