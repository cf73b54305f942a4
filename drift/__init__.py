"""Drift statistics (pure functions over binned distributions), the drift service that
applies them to the gateway's feature records, and A/B verdicts between variants (``ab``)."""
