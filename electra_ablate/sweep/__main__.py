"""`python -m electra_ablate.sweep`."""

from electra_ablate.sweep.runner import cli_main

if __name__ == "__main__":
    cli_main()
