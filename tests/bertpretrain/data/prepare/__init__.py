"""Tests of bertpretrain.data.prepare, one module per module of the subpackage."""
