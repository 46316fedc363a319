"""bertcli: pretrain BERT encoders from the command line."""

__version__ = "0.1.0"
