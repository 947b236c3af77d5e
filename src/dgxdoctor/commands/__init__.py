"""What each command of the command line does beyond parsing it: running, rendering, writing files.

``cli.py`` parses the arguments and calls in here, each command importing only its own module so that
``dgxdoctor --help`` and ``dgxdoctor check`` load nothing they do not use.
"""
