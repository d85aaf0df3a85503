"""Serving: raw-text SavedModels, the MLflow pyfunc model, the in-memory predictor and the
passage search index.
"""
