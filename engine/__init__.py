"""The worldcast engine: step scheduler, chunk rollout, KV pool."""
