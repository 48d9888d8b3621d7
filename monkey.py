#!/usr/bin/env python3
"""Thin launcher: `./monkey.py ARGS` is `monkey ARGS`, straight from a checkout."""

import sys

from monkey.shell.entry import main

if __name__ == "__main__":
    sys.exit(main())
