"""The time-to-quality benchmark's parts (``benchmarks/time_to_quality.py`` is the command):
:mod:`ttq.settings` (sizes, recipes), :mod:`ttq.jobs` (our job documents), :mod:`ttq.heldout` (the
held-out sets and per-row scoring), :mod:`ttq.store` (finished runs on disk), :mod:`ttq.peer` (the
Hugging Face peer), :mod:`ttq.runner` (running each run once) and :mod:`ttq.report` (statistics,
tables, the plot)."""
