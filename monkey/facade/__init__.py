"""The parts the Monkey facade (``monkey.api``) delegates to beyond runs and jobs: sweeps,
metrics, comparisons, reports and exports (``tracking``), and the export of runs to SQLite
or CSV (``export``). They sit beside the facade, above the core and ``monkey.tracking``."""
