"""The drift service over HTTP: its settings and app (``app``), the roles built and wired
(``state``), and one module per resource (records, baselines, thresholds, segments, fleet,
pages). It stands on both ``inferwatch.drift`` and ``inferwatch.drift.ab``, which never
import it."""
