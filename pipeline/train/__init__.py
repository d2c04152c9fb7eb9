"""Training of the assets a build consumes.

:mod:`pipeline.train.sliders` trains the (class, shift) LoRA concept sliders with the
text-slider objective of the reference and writes them into a slider store in the
published layout (``cnsbench train-sliders``), so ``generator.slider_store`` can point at
sliders made here instead of released ones; :mod:`pipeline.train.run` trains every pair of
a config through the executors.
"""
