"""Verdicts, one module per failure domain: pure functions from values to Findings, shared by checks and diagnose."""
