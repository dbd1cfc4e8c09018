"""``python3 -m megha_cli.dashboard``: the dashboard server (``megha up
--dashboard-port`` starts it this way)."""

import sys

from megha_cli.dashboard.server import main

sys.exit(main())
