from workers.cli import main

raise SystemExit(main())
