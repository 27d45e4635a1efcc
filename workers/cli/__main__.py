"""``python -m workers.cli``: the ``batchfleet`` command."""

import sys

from workers.cli.main import main

sys.exit(main())
