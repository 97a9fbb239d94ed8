"""``python -m mezo_rl`` is the ``mezo-rl`` command."""
import sys

from mezo_rl.cli import main

sys.exit(main())
