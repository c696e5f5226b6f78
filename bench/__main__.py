"""Run every benchmark module in its own process, in name order, and pass its `name: value unit` lines through."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

from bench import options


def main() -> int:
    here = Path(__file__).parent
    names = sorted(m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_"))
    parser = options.parser("bench", __doc__, "", "bench_storage bench_peers", "alert")
    parser.add_argument(
        "only", nargs="*", help="run only the modules whose names contain one of these (of: " + ", ".join(names) + ")"
    )
    only = parser.parse_args().only
    unknown = [o for o in only if not any(o in name for name in names)]
    if unknown:
        parser.error(f"no benchmark module matches {unknown[0]!r}")
    failed = 0
    for name in names:
        if only and not any(o in name for o in only):
            continue
        print(f"# {name}", file=sys.stderr, flush=True)
        rc = subprocess.call([sys.executable, "-m", f"bench.{name}"])
        if rc != 0:
            print(f"# {name} failed with exit status {rc}", file=sys.stderr, flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
