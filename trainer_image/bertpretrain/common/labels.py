"""The label value that every stage agrees marks "no target here", shared by the data, the model and
the metrics."""

from __future__ import annotations

from typing import Final

# The label of a position without a masked-LM target (a token that was not masked, or padding), and
# of a next-sentence label slot that holds no pair: the loss and the accuracy skip it. -100 is
# PyTorch's ``cross_entropy(ignore_index=...)`` default, and the value Hugging Face's BERT uses in
# ``labels``, so that batches and checkpoints carry over unchanged.
IGNORE_INDEX: Final = -100
