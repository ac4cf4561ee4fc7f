"""io/logs."""
