"""io/storage."""
