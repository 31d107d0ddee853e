"""`python -m traingate ...` is the `traingate` command."""

from traingate.pipeline.cli import main

main()
