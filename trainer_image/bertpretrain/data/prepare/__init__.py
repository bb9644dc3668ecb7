"""Offline data preparation: corpus -> vocabulary -> documents -> instances -> HDF5 shards.

The stage's driver is :mod:`.stage` (``prepare(spec)``); the training loop imports nothing here."""
