"""Probes run by the serving environment's Python (which has torch), never imported by the agent."""
