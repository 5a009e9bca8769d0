"""``python -m kvlab.cli``: the ``kvlab`` command."""

import sys

from kvlab.cli import main

sys.exit(main())
