"""Aggregation: turn the ``samples`` and ``predictions`` tables of a build into metrics and a report.

:mod:`pipeline.aggregate.metrics` computes the CNS-Bench metrics (accuracy drop per
scale, failure points and their distribution, margin) with pandas only, so it runs on
any machine without torch.  :mod:`pipeline.aggregate.report` writes them as CSV, JSON,
PNG plots and a self-contained ``index.html``.  :mod:`~pipeline.aggregate.bootstrap` adds
confidence intervals and the pairwise comparison of classifiers,
:mod:`~pipeline.aggregate.page` assembles the page from the analyses' sections,
:mod:`~pipeline.aggregate.images` reads sample images from the WebDataset tars (image
strips), and :mod:`~pipeline.aggregate.compare` reports several outputs side by side.
"""
