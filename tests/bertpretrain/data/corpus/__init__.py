"""Tests of bertpretrain.data.corpus, one module per module of the subpackage."""
