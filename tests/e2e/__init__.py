"""End to end: the command line, its outputs against the goldens, the report in a browser."""
