"""``python -m case_studies.arach run|table|quick``."""

from case_studies.arach.study import main

raise SystemExit(main())
