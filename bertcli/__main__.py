"""`python -m bertcli` (also what torchrun runs: `torchrun ... -m bertcli pretrain ...`)."""

from bertcli.cli import main

if __name__ == "__main__":
    main()
