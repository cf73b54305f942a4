"""The NVML GPU exporter: USE metrics and XID errors for the GPUs behind vLLM."""
