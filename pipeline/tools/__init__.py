"""Commands that are not pipeline stages: predict, retrieval-eval, and the inspection tools
(fill-mask, nsp, attention, embed); `python -m pipeline <command>` dispatches to them.
"""
