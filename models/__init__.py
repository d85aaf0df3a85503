"""BERT models: encoder (keras-hub layers), pretraining task, published sizes.

    >>> from models import build_pretrainer, presets
    >>> sorted(presets.PRESETS)[:2]
    ['base', 'large']
"""

from models import params, presets, schedules
from models.bert import BertEncoder
from models.pretraining import BertPretrainer, build_pretrainer, mlm_loss, nsp_loss

__all__ = ["BertEncoder", "BertPretrainer", "build_pretrainer", "mlm_loss", "nsp_loss", "params",
           "presets", "schedules"]
