"""The operator API: list units, take them out of service, add and remove them, audit log."""
