"""`python -m amemory ...` is the same as the `amemory` console script."""

from amemory.cli import main

raise SystemExit(main())
