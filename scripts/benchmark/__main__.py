"""python -m scripts.benchmark: the performance table (scripts/benchmark/__init__.py)."""

import sys

from .cli import main

sys.exit(main())
