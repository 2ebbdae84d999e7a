"""`python -m server ...`: forkserve's command line (server.cli.main); runs without TensorFlow."""

import sys

from server.cli.main import main

sys.exit(main())
