"""``python -m case_studies.conventions run|table|quick``."""

from case_studies.conventions.study import main

raise SystemExit(main())
