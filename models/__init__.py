"""BERT models: encoder (keras-hub layers), pretraining task, published sizes, tokenizer.

    >>> from models import build_pretrainer, presets
    >>> sorted(presets.PRESETS)[:2]
    ['base', 'large']

The names below load on first use, so `models.tokenizer` (pure Python, the Beam workers'
tokenizer) imports without Keras or TensorFlow.
"""

import importlib
import os

# oneDNN's CPU kernels on every x86 CPU, not only those TensorFlow picks (pipeline/__init__.py
# says why); read when TensorFlow loads. TF_ENABLE_ONEDNN_OPTS=0 in the environment keeps Eigen.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

_EXPORTS = {
    "BertEncoder": "models.bert",
    "BertPretrainer": "models.pretraining",
    "build_pretrainer": "models.pretraining",
    "mlm_loss": "models.pretraining",
    "nsp_loss": "models.pretraining",
    "params": "models.params",
    "presets": "models.presets",
    "schedules": "models.schedules",
}

__all__ = sorted([*_EXPORTS, "load_keras"])

# Every module that registers Keras classes (`register_keras_serializable`): a saved model names
# them, and Keras finds them only once their module has been imported.
SERIALIZABLE_MODULES = ("models.bert", "models.heads", "models.optimizers", "models.preprocessor",
                        "models.pretraining", "models.schedules", "models.window_heads")


def load_keras(path, **kwargs):
    """`keras.saving.load_model` (safe mode: no code from the file runs) with every class of
    this package registered first, in any process, whatever it imported before."""
    for module in SERIALIZABLE_MODULES:
        importlib.import_module(module)
    import keras

    return keras.saving.load_model(str(path), **kwargs)


def __getattr__(name: str):
    if name not in _EXPORTS:  # a submodule (`models.pretraining.X` in code or a saved model)
        try:
            return importlib.import_module(f"models.{name}")
        except ModuleNotFoundError as error:
            if error.name != f"models.{name}":
                raise
            raise AttributeError(f"module 'models' has no attribute {name!r}") from None
    module = importlib.import_module(_EXPORTS[name])
    return module if module.__name__ == f"models.{name}" else getattr(module, name)
