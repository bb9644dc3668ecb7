"""The BertPretrainJob operator (kopf) and the ``bertjob`` CLI: spec -> validate -> render ->
apply -> watch the child -> status. Imports the job API (``bertjob_api``), never the trainer."""
