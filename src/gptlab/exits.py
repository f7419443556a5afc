"""The exit codes of every gptlab tool: 0 done; 1 a failed sweep job or an unexpected error (with
its traceback); 2 bad input, one paragraph, before any long work; 130 Ctrl-C, 143 SIGTERM (a
checkpoint saved). Hydra ends a command line it cannot compose with 1: gptlab.cli.compose
composes it first, so that is a 2."""

FAILED = 1
BAD_INPUT = 2
CTRL_C = 130
SIGTERM = 143


def code_of_signal(signal_name: str) -> int:
    """The exit code of a run stopped by `signal_name` ("Ctrl-C" or "SIGTERM")."""
    return CTRL_C if signal_name == "Ctrl-C" else SIGTERM
