"""``python -m hiraishin``: the same as the ``hiraishin`` console script."""

import sys

from .cli import main

sys.exit(main())
