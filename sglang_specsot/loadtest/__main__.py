"""`python -m sglang_specsot.loadtest` (the command's help: `--help`)."""

import sys

from sglang_specsot.loadtest import main, stop_on_sigterm

stop_on_sigterm()
sys.exit(main())
