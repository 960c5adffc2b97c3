"""``python -m lorekv``: the command line (see :mod:`lorekv.cli`)."""

from lorekv.cli import main

main()
