"""The exit-code protocol of every gptlab tool, in one place.

  0    done
  1    a job of a sweep failed, or an unexpected error (with its traceback)
  2    bad input: one paragraph names the key or file and the way out, before any long work
  130  stopped by Ctrl-C, 143 stopped by SIGTERM (a checkpoint was saved; resume= continues)

Hydra itself ends a command line it cannot compose with exit code 1. gptlab.cli.app tells that
apart from a task's own exit 1 by composing the same command line first (a command line that
composes cannot fail composition), and turns it into 2; no flag records whether a task started."""

FAILED = 1
BAD_INPUT = 2
CTRL_C = 130
SIGTERM = 143


def code_of_signal(signal_name: str) -> int:
    """The exit code of a run stopped by `signal_name` ("Ctrl-C" or "SIGTERM")."""
    return CTRL_C if signal_name == "Ctrl-C" else SIGTERM
