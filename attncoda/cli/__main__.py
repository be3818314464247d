"""``python -m attncoda.cli`` runs the ``attncoda`` command (as ``python -m attncoda`` does)."""

import sys

from attncoda.cli import main

sys.exit(main())
