"""Storage: tables, engine and migrations."""
