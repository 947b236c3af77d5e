"""Checks decide; they read the world only through ``dgxdoctor.sources`` and the injected Environment."""
