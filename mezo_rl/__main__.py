"""``python -m mezo_rl`` is the ``mezo-rl`` command."""
import sys

from mezo_rl.cli.main import main

sys.exit(main())
