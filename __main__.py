from npuc.compiler.cli import main

main()
