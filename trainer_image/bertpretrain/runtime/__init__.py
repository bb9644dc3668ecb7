"""Runtime: the world this process runs in (rank, world size), its device, data parallelism
(DDP, Horovod) and the engine (precision, accumulation) that hides them from the training loop."""
