"""The ``specgate`` command line: the top layer, over gateway/, backends/ and contracts/."""
