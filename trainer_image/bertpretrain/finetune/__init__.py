"""Downstream fine-tuning: the tasks people compare BERTs by, run on the job's own model.

Pipeline: task files -> examples (:mod:`.tables` for classification, :mod:`.squad` for extractive
question answering) -> features (token ids, windows) -> the model with a small head
(:mod:`bertpretrain.model.heads`) -> training and evaluation (:mod:`.train`) -> metrics
(:mod:`.metrics`, :mod:`.squad`) -> ``finetune.json`` and the job's status (:mod:`.results`).
"""
