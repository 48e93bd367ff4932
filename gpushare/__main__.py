from gpushare.cli import main

main()
