"""`python -m instrumented_runtime --dp N --tp N --pp N --cp N --ep N ... --out DIR` (DESIGN §7)."""

from .launch import main

raise SystemExit(main())
