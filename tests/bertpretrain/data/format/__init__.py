"""Tests of bertpretrain.data.format: the shard schema and its files, and masked-LM targets."""
