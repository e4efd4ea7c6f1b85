"""`python -m h3core.cli`: the same command line as the `h3core` script."""

from h3core.cli import main

main()
