"""Training: what Lightning trains."""
