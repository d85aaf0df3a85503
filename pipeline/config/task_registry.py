"""The fine-tuning task registry: `finetune.task` name -> its task class, the one map of the
tasks that exist.

The task classes (pipeline/finetuning/tasks/) enter it through their `@register` decorator
when their package is imported (pipeline/__init__.py imports it, so before any config is
loaded); config validation asks it when it checks a `finetune` section (the task's `datasets`,
`check_config`, `multitask`), and `pipeline.finetuning.tasks.get` builds a task from it. It
lives in the config layer, the lowest one, because validation may not import the fine-tuning
layer above it (the layers contract in pyproject.toml).
"""

from __future__ import annotations

_TASKS: dict[str, type] = {}


def add(task_class: type) -> None:
    """Registers `task_class` under its `name`; ValueError if another class has that name."""
    name = task_class.name
    if name in _TASKS and _TASKS[name] is not task_class:
        raise ValueError(f"two fine-tuning tasks are named {name!r}: "
                         f"{_TASKS[name].__module__} and {task_class.__module__}")
    _TASKS[name] = task_class


def remove(name: str) -> None:
    """Unregisters the task `name` (a task a test or a notebook registered for a while)."""
    _TASKS.pop(name, None)


def lookup(name: str) -> type | None:
    """The task class registered as `name`, None if there is none."""
    return _TASKS.get(name)


def names() -> tuple[str, ...]:
    """The registered task names, in registration order."""
    return tuple(_TASKS)


def builtin_names() -> tuple[str, ...]:
    """The tasks shipped in pipeline/finetuning/tasks/ (finetune.task's values in the docs)."""
    return tuple(name for name, cls in _TASKS.items()
                 if cls.__module__.startswith("pipeline.finetuning.tasks."))
