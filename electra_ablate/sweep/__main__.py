"""`python -m electra_ablate.sweep`."""

from electra_ablate.sweep.run import cli_main

if __name__ == "__main__":
    cli_main()
