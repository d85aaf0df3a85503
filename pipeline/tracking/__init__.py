"""Tracking: MLflow runs (runs.py: the pipeline run, a child per stage, params, the registry
champion, run files for resume) and lineage (lineage.py: fingerprints, stage markers, reuse).
"""
