from gpuwarden.cli import main

main()
