"""Sweeps: each job isolated and recorded, seed statistics, the summary tables and plot."""
