"""The exit codes of every tool: 0 done; 1 a failed sweep job or an unexpected error; 2 bad
input (Hydra's own 1 for a command line it cannot compose never comes: gptlab.cli.app); 130
Ctrl-C, 143 SIGTERM."""

FAILED = 1
BAD_INPUT = 2
CTRL_C = 130
SIGTERM = 143


def code_of_signal(signal_name: str) -> int:
    return CTRL_C if signal_name == "Ctrl-C" else SIGTERM
