"""What data preparation writes and loading reads: the shard schemas and their HDF5 reading, the
vocabulary's files and tokenizer, masked-LM targets, and where the data stage put its output."""
