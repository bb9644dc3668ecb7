"""The BertPretrainJob API: spec, defaults, validation, the resolved plan and the contract that the
operator (``bertjob``) and the trainer (``bertpretrain``) both import and never each other."""
