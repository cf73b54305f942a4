"""A/B verdicts between two variants of one model: pure statistics (``stats``), always-valid
sequential tests (``sequential``), the metric registry (``spec``), the decision
(``decision``), and their faces: arms read from the drift windows (``source``), JSON and
HTTP (``http``), Prometheus gauges (``exposition``) and the HTML section (``report``)."""
