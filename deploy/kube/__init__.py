"""The Kubernetes manifests' generator: settings, object factories, one module per concern
(workloads, monitoring, autoscaling, network, tracing) and the kustomize tree (layout)."""
