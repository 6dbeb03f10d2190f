from sc_app.cli import main

raise SystemExit(main())
