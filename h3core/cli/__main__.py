from h3core.cli import main

main()
