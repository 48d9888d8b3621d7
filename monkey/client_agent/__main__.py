"""``python -m monkey.client_agent --root ROOT --socket PATH``: run the worker agent."""

import sys

from .agent import main

sys.exit(main())
