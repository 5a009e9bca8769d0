"""``python -m kvlab``: the ``kvlab`` console script (:func:`kvlab.cli.main`)."""

import sys

from kvlab.cli import main

if __name__ == "__main__":
    sys.exit(main())
