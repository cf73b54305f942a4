"""`inferwatch demo`: scenarios a newcomer watches on a running local stack (`make up`) in
their first ten minutes: steady traffic, a burst, a vLLM outage, a slow canary in an A/B
experiment and a prompt-length drift, each announced with where its effect shows, bounded
in time and requests, and checked for that effect before the next one starts."""
