"""pipeline.api.models on Ray: a notebook's model (a class defined in ``__main__``) is sent to
the actors by value and scores as it does in process.

On a copy of the session's tiny build (``tiny_reference``), with the test worker's Ray
(``ray_session``): the module joins the suite's Ray unit, so it starts no Ray of its own.
"""

from __future__ import annotations

import shutil

import pytest
import torch

PRE = {"resize": 32, "crop": 32, "interpolation": "bilinear", "mean": [0.5] * 3, "std": [0.5] * 3}
NET = (  # as a notebook cell defines it: class and methods in __main__, importable by no worker
    "import torch\n"
    "class Net(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        torch.manual_seed(0)\n"
    "        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2)\n"
    "        self.head = torch.nn.Linear(4 * 15 * 15, 1000)\n"
    "    def forward(self, x):\n"
    "        return self.head(torch.relu(self.conv(x)).flatten(1))\n"
)


class Importable(torch.nn.Module):
    """The same network as ``NET``'s, defined in an importable module."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2)
        self.head = torch.nn.Linear(4 * 15 * 15, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


@pytest.mark.slow
def test_on_ray_a_model_defined_in_main_travels_by_value_and_scores_as_in_process(tiny_reference, tmp_path, ray_session):
    import cnsbench
    from pipeline.api.models import classifier_metrics

    def evaluate(model, output, **kwargs):
        cnsbench.evaluate(model, output, output=output, in_place=True, **kwargs)
        return classifier_metrics(output, kwargs["name"])

    output = str(tmp_path / "out")
    shutil.copytree(tiny_reference, output)
    ns = {"__name__": "__main__"}
    exec(NET, ns)  # noqa: S102 (the test's own source)
    Net = ns["Net"]
    assert Net.__module__ == "__main__"
    local = evaluate(Importable(), output, name="here", preprocess=PRE, runner="local", echo=lambda m: None)
    ray_run = evaluate(Net(), output, name="there", preprocess=PRE, runner="ray", echo=lambda m: None)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "classifier"} for r in rows]  # noqa: E731
    assert strip(ray_run["summary"]) == strip(local["summary"]) and ray_run["summary"]
