"""Training stage: the phase loop, its optimizer and schedule, checkpoints, evaluation, logs,
preemption and the progress it reports to the job's status."""
