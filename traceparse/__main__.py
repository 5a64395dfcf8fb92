"""``python -m traceparse``: the same as the ``traceparse`` command."""

import sys

from traceparse.cli import main

sys.exit(main())
