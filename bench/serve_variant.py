"""`quota-ledger` with the take statement swapped, for bench/chain_bench.py's chain-off side:

    python bench/serve_variant.py [--take-sql FILE] serve --bind HOST:PORT --workers N

Without --take-sql it is `quota-ledger` itself, so both sides start the same way. The swap happens
in the server's master before it forks its workers, so every worker runs FILE. Never used by the service.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from take_bench import use_take_statement  # noqa: E402

from service.cli import main  # noqa: E402

if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv[:1] == ["--take-sql"]:
        sql = Path(argv[1]).read_text()
        use_take_statement("\n".join(line for line in sql.splitlines() if not line.startswith("--")).strip())
        argv = argv[2:]
    sys.exit(main(argv))
