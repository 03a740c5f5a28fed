from tracekit.cli.main import main

main()
