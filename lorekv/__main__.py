"""``python -m lorekv`` and the ``lorekv`` console script: the command line (see :mod:`lorekv.cli`).

Without typer (the ``lorekv[cli]`` extra) it prints one line naming the install and exits with 2.
"""

import sys

from lorekv.extras import require


def main() -> None:
    try:
        require("typer", extra="cli", what="command line")
    except ModuleNotFoundError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    from lorekv.cli import main as cli_main

    cli_main()


if __name__ == "__main__":
    main()
