"""The run directory."""
