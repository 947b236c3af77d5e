from dgxdoctor.cli import main

main()
