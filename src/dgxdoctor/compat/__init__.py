"""Python 3.10 stand-ins for what 3.11 added to the standard library; one module per need, so that a command loads
only the one it uses (``tomllib`` only where a file is read, ``aio`` only where an event loop runs)."""
