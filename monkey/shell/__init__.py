"""The command line: one-shot commands and the interactive `monkey>` shell."""
