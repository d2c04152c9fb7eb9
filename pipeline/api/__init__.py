"""The Python API: what the commands do, as functions that return plain data.

``import pipeline`` exposes these names lazily (``pipeline/__init__.py``); each raises
:class:`pipeline.errors.CnsbenchError` for bad input, with the command line's message.
"""
