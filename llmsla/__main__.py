"""``python -m llmsla``: the command line (the same as the ``llmsla`` script)."""

import sys

from llmsla.app.cli import main

sys.exit(main())
