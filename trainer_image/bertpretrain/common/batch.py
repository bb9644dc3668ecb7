"""The batch every trainer stage passes on: the data loader yields it, the engine consumes it.

Defined here, in the package every stage may import, so that neither the data stage nor the
runtime imports the other for a type.
"""

from __future__ import annotations

import torch

# Tensors by input name (``input_ids``, ``attention_mask``, ``masked_lm_labels``...), each
# [micro_batch, seq_len] (int64 ids or labels) or [micro_batch] (``next_sentence_labels``).
Batch = dict[str, torch.Tensor]
