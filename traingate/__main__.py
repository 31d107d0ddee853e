"""`python -m traingate ...` is the `traingate` command, exit status included."""

import sys

from traingate.pipeline.cli import main

sys.exit(main())
