"""``python -m saucer.tools.desktop``: serve the desktop tools over stdio (``--help`` for the options)."""

from __future__ import annotations

import sys

from saucer.tools.desktop import PYTHON_HINT

try:
    from saucer.tools.desktop.server import main
except ImportError as exc:  # the desktop extra is not installed
    print(f"saucer's desktop server needs its Python packages: {PYTHON_HINT} ({exc})", file=sys.stderr)
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main())
