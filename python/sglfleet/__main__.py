import sys

from sglfleet.cli import main

sys.exit(main())
