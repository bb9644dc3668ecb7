"""What every stage of the trainer shares and nothing else: durable file writes (the atomic write
itself is :mod:`bertjob_api.files`), the host's CPU count, the label of no target, the batch type,
figures made fit for JSON and the error of a lost peer. Imports only the API package and libraries."""
