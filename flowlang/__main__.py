"""``python -m flowlang``: the same command line as the ``flowlang`` script."""

from flowlang.cli import main

raise SystemExit(main())
