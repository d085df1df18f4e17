"""Sessions: lifecycle, per-user state, flush/cancel semantics."""
