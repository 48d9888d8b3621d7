"""`python -m monkey ARGS` is `monkey ARGS`."""

import sys

from monkey.shell.entry import main

sys.exit(main())
