"""Data stage: corpus -> vocabulary -> documents -> instances (masking, packing) -> HDF5 shards, and
the loader that reads them back as batches."""
