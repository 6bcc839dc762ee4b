"""`python -m electra_ablate.bench`."""

from electra_ablate.bench.cli import cli_main

if __name__ == "__main__":
    cli_main()
