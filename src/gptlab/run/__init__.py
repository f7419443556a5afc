"""The run directory: its layout, continuing it, its checkpoints and its report."""
