"""``python -m case_studies.rpa run|table|quick``."""

from case_studies.rpa.study import main

raise SystemExit(main())
