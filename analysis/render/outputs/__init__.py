"""Output files: the registry of tables, writing and reading an analysis folder, atomic writes."""
