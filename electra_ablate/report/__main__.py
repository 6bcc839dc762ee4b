"""`python -m electra_ablate.report`."""

from electra_ablate.report.build import cli_main

if __name__ == "__main__":
    cli_main()
