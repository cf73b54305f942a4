"""Drift statistics (pure functions over binned distributions) and, later, the drift service."""
