"""The trainer: corpus -> vocabulary -> instances in HDF5 shards (``data``) -> BERT (``model``) on
this process's devices and data parallelism (``runtime``) -> two-phase LAMB pretraining with
checkpoints, evaluation and progress (``training``) -> a Hugging Face model. Imports the job API
(``bertjob_api``), never the operator."""
