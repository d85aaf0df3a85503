"""Tracking: the pipeline's one door to MLflow. outbox.py: every param, metric, tag, artifact
and run end a stage writes (kept while the store is down; no-ops without a run); runs.py: the
pipeline run, a child per stage, nested runs, params, the registry champion, run files for
resume; lineage.py: fingerprints, stage markers, reuse.
"""
