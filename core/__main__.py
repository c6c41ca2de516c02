"""``python -m lpq``: the same as the ``lpq`` command."""

import sys

from .cli import main

sys.exit(main())
