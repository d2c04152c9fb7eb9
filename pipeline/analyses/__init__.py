"""Analyses: what aggregation computes from an output's samples and predictions tables.

Each analysis is registered in :data:`pipeline.registry.ANALYSES` and listed in a config's
``aggregate.analyses`` (families add their own, see ``Family.analyses``).  The contract is
in :mod:`pipeline.aggregate.analysis`; ``cnsbench aggregate DIR`` re-runs them on an existing
output, so a new analysis never needs a rebuild.  An analysis module may define
``check_options(options, config) -> [problems]``, which ``validate`` and ``build`` call
before any model loads (:func:`pipeline.assets.analysis_option_problems`).
"""
