"""Shift families: what a shift does to an image and what a scale means for it.

A family turns one (class, seed) work unit into trajectories: one image per scale for
each of its shifts.  Families are registered in :data:`pipeline.registry.FAMILIES`
(``generator.kind`` and ``families[].kind`` in a config); :mod:`pipeline.families.base`
holds the contract every family implements.
"""
