"""Experiment tracking: the in-job logger, metrics ingestion and queries, sweeps, compare,
diff, plots and reports. Modules are imported one by one; this package imports nothing."""
