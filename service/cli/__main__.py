"""`python -m service.cli`: the `quota-ledger` command (what the service's own subprocesses run)."""

import sys

from service.cli import main

sys.exit(main())
