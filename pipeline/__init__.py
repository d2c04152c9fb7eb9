"""The implementation of cnsbench: robustness benchmarks from continuous generative nuisance shifts.

The package follows the data: ``plan`` -> ``stages.generate`` -> ``stages.filter`` ->
``stages.classify`` -> ``stages.write`` -> ``aggregate``; ``executors`` run the stages
(on Ray Data, or in-process for tests and benchmarks); ``cli`` is the entry point and
``api`` holds the verbs the commands and the public package call.

The public Python surface is the package ``cnsbench`` (docs/python.md); this one names no
API of its own, so each of its submodules (``pipeline.build``, ``pipeline.card``, ...) is
just that.
"""

__version__ = "0.1.0"
