"""`python -m electra_ablate.results`."""

from electra_ablate.results.cli import cli_main

if __name__ == "__main__":
    cli_main()
