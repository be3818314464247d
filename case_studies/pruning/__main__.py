"""``python -m case_studies.pruning run|table|quick``."""

from case_studies.pruning.study import main

raise SystemExit(main())
