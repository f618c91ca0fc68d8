"""``python -m gateway``: the same as the ``specgate`` command (``scripts/gpu/stack.sh`` runs it).

An entry point, never imported: it sits above every layer wherever its file is
(``tests/unit/test_layering.py`` allows ``__main__`` modules to import ``cli``).
"""

from __future__ import annotations

import sys

from cli.main import main

sys.exit(main())
