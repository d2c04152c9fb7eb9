"""One surface: each command calls its verb's API function, and every user-input error is a CnsbenchError.

The commands build, evaluate, refine, card and leaderboard parse their arguments and call
the function ``cnsbench`` exports, the same object; here that function is replaced by a
recorder, so each command must call it exactly once with what it parsed and start no run of
its own.  The second half walks every module of ``pipeline/`` for its exception classes.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
from pathlib import Path
from types import SimpleNamespace

import pytest

import cnsbench
from pipeline.errors import CnsbenchError

REPO = Path(__file__).resolve().parents[1]


class Recorder:
    def __init__(self, returns):
        self.calls = []
        self.returns = returns

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.returns


SUMMARY = SimpleNamespace(lines=lambda: ["recorded"], report=None, trajectories_failed=0, failed=0, table="t",
                          build=None)
CARD = {"benchmarks": []}

# command line -> (module of the function, its name, what it returns, the call it must get)
CASES = {
    "build": (["build", "configs/demo.yaml", "--output", "OUT", "--runner", "local", "--set", "a.b=1", "--verify"],
              "pipeline.api.commands", "build", SUMMARY,
              (("configs/demo.yaml", "OUT"), {"sets": ["a.b=1"], "filter_thresholds": None, "address": None,
                                              "runner": "local", "new_version": False, "verify": True})),
    "evaluate": (["evaluate", "BENCH", "--output", "EV", "--classifiers", "cnn,linear", "--runner", "local", "--filter"],
                 "pipeline.api.evaluate", "evaluate", SUMMARY,
                 (("cnn,linear", "BENCH"), {"output": "EV", "in_place": False, "config": None, "sets": [],
                                            "filter": True, "filter_thresholds": None, "source_kind": None,
                                            "source_labels": None, "follow_symlinks": False, "runner": "local",
                                            "address": None})),
    "refine": (["refine", "OUT", "--classifier", "cnn", "--rounds", "2", "--runner", "local"],
               "pipeline.api.commands", "refine", SUMMARY,
               (("cnn", "OUT"), {"rounds": 2, "runner": "local", "address": None})),
    "card": (["card", "cnn", "--suite", "S.yaml", "--output", "C", "--runner", "local", "--refine", "2"],
             "pipeline.api.commands", "card", CARD,
             (("cnn", "S.yaml"), {"output": "C", "name": None, "model_kind": None, "checkpoint": None,
                                  "model_config_file": None, "outputs": None, "refine": 2, "force": False,
                                  "report": True, "runner": "local"})),
    "leaderboard": (["leaderboard", "A", "B", "--output", "L"], "pipeline.api.commands", "leaderboard", None,
                    ((["A", "B"],), {"output": "L"})),
}


@pytest.mark.parametrize("verb", sorted(CASES))
def test_each_command_calls_its_api_function_once_with_what_it_parsed(verb, monkeypatch):
    from pipeline.cli import main
    from pipeline.output_run import OutputRun

    argv, module, name, returns, (args, kwargs) = CASES[verb]
    assert getattr(cnsbench, verb) is getattr(importlib.import_module(module), name)  # the same object
    recorder = Recorder(returns)
    monkeypatch.setattr(importlib.import_module(module), name, recorder)
    monkeypatch.setattr("pipeline.cli.evaluate.counted_line", lambda *a: "counted")

    def no_run(*a, **k):
        raise AssertionError("the command started a run of its own")

    monkeypatch.setattr(OutputRun, "claim", no_run)
    assert main(argv) == 0
    assert recorder.calls == [(args, kwargs)]


def test_the_verbs_share_one_argument_order():
    """What is scored first, then where from; the output and options keyword-only."""
    for verb, first in (("evaluate", ["classifiers", "source"]), ("refine", ["classifier", "output"]),
                        ("card", ["model", "suite"]), ("leaderboard", ["cards"])):
        params = inspect.signature(getattr(cnsbench, verb)).parameters
        positional = [p for p, v in params.items() if v.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        assert positional == first, verb
    for verb in ("evaluate", "card", "leaderboard"):
        assert inspect.signature(getattr(cnsbench, verb)).parameters["output"].kind is inspect.Parameter.KEYWORD_ONLY


# Errors that are not the input's fault: the environment's, a lost lease, the project's own
# bugs, and a web server's responses (never raised to a command).
NOT_USER_INPUT = {
    "pipeline.io.retry.StorageError": "out of retries or a full disk: the storage's, committed work is kept",
    "pipeline.io.lease.LeaseLost": "another writer took the output over while this one ran",
    "pipeline.io.access.StorageAccessError": "credentials refused by an object store: the environment's",
    "pipeline.executors.ray_private.RayInternalsChanged": "an installed Ray whose internals moved: a bug to fix",
    "pipeline.serve.errors.NotFound": "an HTTP 404 of the review server",
    "pipeline.serve.errors.OutputReplaced": "an HTTP 409 of the review server",
    "pipeline.serve.errors.PreviewFailed": "an HTTP 500 of the review server",
}


def exception_classes() -> dict[str, type]:
    """Every exception class defined in a module of ``pipeline/``: found in the source (a class
    whose base is an exception, by name, to a fixed point), then imported and checked."""
    import pipeline

    trees = {}
    for info in pkgutil.walk_packages(pipeline.__path__, "pipeline."):
        path = REPO / (info.name.replace(".", "/") + ("/__init__.py" if info.ispkg else ".py"))
        if path.is_file() and ".demo.train" not in info.name:  # the demo world's training scripts take no input
            trees[info.name] = ast.parse(path.read_text(encoding="utf-8"))
    known = {n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)}
    candidates: dict[str, list[str]] = {}
    while True:
        grown = False
        for module, tree in trees.items():
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and node.name not in candidates.get(module, []):
                    bases = {ast.unparse(b).rsplit(".", 1)[-1] for b in node.bases}
                    if bases & known:
                        candidates.setdefault(module, []).append(node.name)
                        known.add(node.name)
                        grown = True
        if not grown:
            break
    found = {}
    for module, names in candidates.items():
        loaded = importlib.import_module(module)
        for name in names:
            cls = getattr(loaded, name)
            if isinstance(cls, type) and issubclass(cls, BaseException):
                found[f"{module}.{name}"] = cls
    return found


def test_every_user_input_error_of_pipeline_derives_from_cnsbench_error():
    classes = exception_classes()
    assert len(classes) >= 30 and "pipeline.config.base.ConfigError" in classes  # the walk found them
    assert set(NOT_USER_INPUT) <= set(classes), set(NOT_USER_INPUT) - set(classes)
    wrong = sorted(q for q, cls in classes.items() if q not in NOT_USER_INPUT and not issubclass(cls, CnsbenchError))
    assert wrong == []
    assert not any(issubclass(classes[q], CnsbenchError) for q in NOT_USER_INPUT)


def test_the_command_line_keeps_the_traceback_of_anything_else(monkeypatch, capsys):
    """A CnsbenchError is a message and exit 2; another ValueError is a bug and propagates."""
    from pipeline.cli import main

    def user(*a, **k):
        raise CnsbenchError("leaderboard: what was wrong")

    monkeypatch.setattr("pipeline.api.commands.leaderboard", user)
    assert main(["leaderboard", "A", "--output", "L"]) == 2
    assert capsys.readouterr().err.strip() == "cnsbench leaderboard: error: leaderboard: what was wrong"

    def bug(*a, **k):
        raise ValueError("a bug")

    monkeypatch.setattr("pipeline.api.commands.leaderboard", bug)
    with pytest.raises(ValueError, match="a bug"):
        main(["leaderboard", "A", "--output", "L"])
