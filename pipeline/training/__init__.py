"""Pretraining: the task and its train step, the tf.data input, the tf.distribute strategy,
callbacks, checkpoints, phases, MFU. The pretrain stage (pipeline/stages/pretrain.py) calls these.
"""
