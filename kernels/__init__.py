"""Device kernels behind plain functions, each with a PyTorch fallback."""
