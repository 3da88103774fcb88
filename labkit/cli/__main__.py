"""`python -m labkit.cli`: the `labkit` command."""
from labkit.cli import main

main()
