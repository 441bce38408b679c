"""`python -m theory_checks [--quick] [--only NAME] ...`, same as `amemory check`."""

from theory_checks.cli import main

raise SystemExit(main())
