from sparkafka.cli import main

main()
