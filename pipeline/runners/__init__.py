"""Executors of the stage chain: ``ray_runner`` (Ray Data actor pools) and ``local`` (in-process)."""
