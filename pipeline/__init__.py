"""cnsbench: robustness benchmarks for image classifiers from continuous generative nuisance shifts.

The package follows the data: ``plan`` -> ``stages.generate`` -> ``stages.filter`` ->
``stages.classify`` -> ``stages.write`` -> ``aggregate``; ``executors`` run the stages
(on Ray Data, or in-process for tests and benchmarks); ``cli`` is the entry point.
"""

__version__ = "0.1.0"
