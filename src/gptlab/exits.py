"""The exit codes of every tool: 0 done; 1 a failed sweep job or an unexpected error; 2 bad
input (Hydra's own 1 for a command line it cannot compose never comes: gptlab.cli.app); 130
Ctrl-C, 143 SIGTERM. And Ctrl-C before a tool can catch it (its imports: torch and Lightning
take seconds) as one line and 130, not a traceback."""

import signal
import sys

FAILED = 1
BAD_INPUT = 2
CTRL_C = 130
SIGTERM = 143


def code_of_signal(signal_name: str) -> int:
    return CTRL_C if signal_name == "Ctrl-C" else SIGTERM


def stop_at_ctrl_c(tool: str) -> None:
    """From now on Ctrl-C ends the process with one line and CTRL_C wherever it lands, an
    import included (SystemExit: what a `finally` holds still runs), until catch_ctrl_c."""

    def stop(signum, frame):
        print(f"{tool}: stopped by Ctrl-C.", file=sys.stderr, flush=True)
        raise SystemExit(CTRL_C)

    stop.stops_quietly = True
    signal.signal(signal.SIGINT, stop)


def catch_ctrl_c() -> bool:
    """Ctrl-C a KeyboardInterrupt again, for a tool that catches it (gptlab.cli.app: what its
    start made is removed), where stop_at_ctrl_c set it to stop; True when it had."""
    if not getattr(signal.getsignal(signal.SIGINT), "stops_quietly", False):
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return True
