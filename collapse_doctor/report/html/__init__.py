"""report/html."""
