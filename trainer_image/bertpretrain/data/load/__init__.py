"""What the training loop reads: a phase's HDF5 shards as batches, split across ranks, with dynamic
masking drawn as they are read; nothing here imports data preparation."""
