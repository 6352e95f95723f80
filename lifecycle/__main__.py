# The program is assembled by the composition package (lifecycle's own modules know no
# task worker); flowstream.cli adds the worker's wait: tasks and the demo.
from flowstream.cli import main

raise SystemExit(main())
