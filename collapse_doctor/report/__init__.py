"""Renderers: each reads only a Diagnosis (text, JSON, JUnit, GitHub annotations, Markdown)."""
