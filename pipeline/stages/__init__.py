"""The stages: one module each, with `run(config: Config, **options) -> dict` (the CLI passes
the validated config and the stage's own command-line options, e.g. glue's `tasks`); what each
is: pipeline/stage_spec.py."""
