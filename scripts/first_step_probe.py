"""`gptlab-train`, plus one line on stderr when the first training step has finished.

    python scripts/first_step_probe.py debug=fast ...      # same arguments as gptlab-train

scripts/benchmark.py runs this to time start-up (command to first training step) without
changing gptlab: it is the console script's own `main()`, with GPTModule's
`on_train_batch_end` hook wrapped to print `GPTLAB_FIRST_STEP <unix time>` once.
"""

import sys
import time

from gptlab.module import GPTModule
from gptlab.train import main

MARKER = "GPTLAB_FIRST_STEP"
_original = GPTModule.on_train_batch_end
_seen = False


def _on_train_batch_end(self, *args, **kwargs):
    global _seen
    if not _seen:
        _seen = True
        print(f"{MARKER} {time.time():.6f}", file=sys.stderr, flush=True)
    return _original(self, *args, **kwargs)


GPTModule.on_train_batch_end = _on_train_batch_end

if __name__ == "__main__":
    sys.argv[0] = "gptlab-train"
    main()
