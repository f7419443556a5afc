"""The command-line tools (train, eval, generate, inspect) over one shared wrapper."""
