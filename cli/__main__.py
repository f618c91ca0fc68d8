"""``python -m cli``: the same as the ``specgate`` command."""

from __future__ import annotations

import sys

from cli.main import main

sys.exit(main())
