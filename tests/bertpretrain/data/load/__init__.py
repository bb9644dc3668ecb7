"""Tests of bertpretrain.data.load: the shards read back as batches."""
