"""The one error a fine-tuning file raises: it names the file and, where there is one, the row."""

from __future__ import annotations

from pathlib import Path


class TaskDataError(ValueError):
    """A fine-tuning file that cannot be used: missing, unreadable, a missing column, a label
    outside the declared set, a SQuAD answer that does not match its context, no examples.

    The message is ``"<file>: row <row>: <problem>"`` (``"<file>: <problem>"`` without a row);
    ``row`` counts from 1 as an editor shows it: the line of a TSV, CSV or JSON Lines file (a
    header is line 1), the row of a Parquet file, the question of a SQuAD file (in file order).
    A ValueError, so that the trainer's entry point exits with code 1.
    """

    def __init__(self, file: Path | str, problem: str, row: int | None = None):
        self.file = str(file)
        self.row = row
        self.problem = problem
        where = f"{file}: row {row}" if row is not None else str(file)
        super().__init__(f"{where}: {problem}")
