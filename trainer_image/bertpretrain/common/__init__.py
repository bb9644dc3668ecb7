"""What every stage of the trainer shares and nothing else: durable file writes (the atomic write
itself is :mod:`bertjob_api.files`), the host's CPU count, the label of no target, the batch type
and figures made fit for JSON. Imports only the API package and libraries."""
