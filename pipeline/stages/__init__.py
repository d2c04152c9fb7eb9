"""Pipeline stages, one per file: generate -> filter -> classify -> write.

Each stage is a callable class: ``__init__`` stores the config and pickles cheaply,
``setup()`` loads weights once per worker (lazily on the first batch), and
``__call__(pyarrow.Table) -> pyarrow.Table`` processes one batch of trajectory rows.
The same classes run in a Ray actor pool (``pipeline.executors.ray_data``) or
in-process (``pipeline.executors.in_process``).
"""
