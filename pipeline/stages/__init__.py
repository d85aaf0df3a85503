"""The stages: one module each, `run(config, log) -> dict`; what each is: pipeline/stage_spec.py."""
