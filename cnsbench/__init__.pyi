# The signatures of cnsbench's lazy names, for help()'s readers, IDEs and type checkers.
from pipeline.api.commands import build as build, card as card, leaderboard as leaderboard, refine as refine
from pipeline.api.evaluate import evaluate as evaluate
from pipeline.api.output import Benchmark as Benchmark, open_output as open_output
from pipeline.errors import CnsbenchError as CnsbenchError

__version__: str
__all__ = ["__version__", "CnsbenchError", "open_output", "Benchmark", "build", "evaluate", "refine", "card",
           "leaderboard"]
