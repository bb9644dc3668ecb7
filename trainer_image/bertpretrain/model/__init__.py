"""Model stage: the BERT for pretraining, its config and presets, and its checkpoints in Hugging
Face's format, in and out."""
