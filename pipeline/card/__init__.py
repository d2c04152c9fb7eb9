"""Robustness cards and leaderboards: one model across every benchmark of a suite.

A *suite* (:mod:`pipeline.card.suite`) names benchmarks -- build configs, existing outputs,
released datasets -- each with its family.  ``cnsbench card`` (:mod:`pipeline.card.make`)
adds a model to every benchmark's output (:mod:`pipeline.card.outputs`: the build,
evaluate and reclassify paths, so only that model runs on committed images), computes each
family's headline metrics with bootstrap intervals (:mod:`pipeline.card.headline`) and
writes ``card.json`` and ``card.html`` (:mod:`pipeline.card.page`).  ``cnsbench
leaderboard`` (:mod:`pipeline.card.leaderboard`) ranks the models of cards made on the same
suite and outputs.  ``cnsbench validate SUITE`` runs :mod:`pipeline.card.check`.

The package sits above the build and evaluate modules and below the command line.
"""
