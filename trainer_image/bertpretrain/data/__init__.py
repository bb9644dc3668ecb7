"""Data stage, in two halves and what they share: :mod:`.prepare` makes the vocabulary and the HDF5
shards (corpus -> vocabulary -> documents -> instances, masked and optionally packed -> shards),
:mod:`.load` reads the shards back as batches for the training loop, and :mod:`.format` holds what
both need (the shard schemas and their reading, masked-LM targets, the vocabulary's reading).

:mod:`.load` imports nothing of :mod:`.prepare`; :mod:`.format` imports neither."""
