"""Unit tests of the renderers and the output dispatcher (collapse_doctor/report/)."""
