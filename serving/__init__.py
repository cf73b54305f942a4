"""The instrumented OpenAI-compatible gateway in front of vLLM, and the vLLM launcher."""
