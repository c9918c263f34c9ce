"""``python -m saucer`` runs the command line."""

from saucer.cli.app import main

main()
