"""Tests of bertpretrain.data.prepare.corpus, one module per module of the subpackage."""
