"""``python -m case_studies.conventions [--quick] [--out DIR]``."""

from case_studies.conventions.study import main

raise SystemExit(main())
