"""`python -m electra_ablate.bench`."""

from electra_ablate.bench.cli import main

if __name__ == "__main__":
    main()
