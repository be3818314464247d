"""``python -m attncoda`` runs the ``attncoda`` command."""

import sys

from attncoda.cli import main

sys.exit(main())
