"""Deploy configs generated from the specs (Prometheus, Alertmanager, Kubernetes), shipped as
package data so the CLI can start the monitoring stack from an installed wheel."""
