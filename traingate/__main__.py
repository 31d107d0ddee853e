"""`python -m traingate ...` is the `traingate` command, exit status included."""

import sys

from traingate.pipeline.gate.cli import main

sys.exit(main())
