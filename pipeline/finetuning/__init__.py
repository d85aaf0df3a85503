"""Fine-tuning: labelled data and features, task models on a pretrained encoder, training
and evaluation, baselines, outputs, sweeps, the automatic recipe, multi-task training
and distillation.
The finetune, sweep, multitask and distill stages call these.
"""
