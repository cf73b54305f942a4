"""What every part of the stack may import: nothing here imports a component (a test holds
this), so the gateway, the exporter, drift, the generators and the CLI all stand on it.

- ``secret_files``: settings read from ``*_FILE`` secrets, as the containers mount them
- ``supervise``: child processes kept running, for ``inferwatch up`` and the gateway's workers
- ``durations``: Prometheus durations, as the alert rules and the settings write them
- ``latency_buckets``: the gateway's latency histogram boundaries, which SLO thresholds must hit
"""
