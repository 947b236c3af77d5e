"""The only code that touches the outside world: thin readers plus pure parse_*() functions."""
