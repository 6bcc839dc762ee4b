"""`python -m electra_ablate.submit`: GLUE test-server files for chosen checkpoints (electra_ablate.glue.submit)."""

from electra_ablate.glue.submit import main

if __name__ == "__main__":
    main()
