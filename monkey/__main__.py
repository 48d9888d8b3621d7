"""`python -m monkey ARGS` is `monkey ARGS`."""

import sys

from monkey.shell.cli import main

sys.exit(main())
