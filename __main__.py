from npuc.cli.app import main

main()
