"""`python -m vlmserve.cli ...` is `vlmserve ...`."""

from vlmserve.cli.main import main

raise SystemExit(main())
