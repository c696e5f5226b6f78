"""``python -m gpulens.cli``: the same as the ``gpulens`` command."""

from __future__ import annotations

import sys

from gpulens.cli.main import main

sys.exit(main())
