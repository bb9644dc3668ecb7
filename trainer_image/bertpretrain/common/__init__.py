"""What every stage of the trainer shares and nothing else: durable file writes and the host's CPU
count. Imports only the API package and libraries."""
