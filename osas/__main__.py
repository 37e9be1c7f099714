import sys

from osas.cli import main

sys.exit(main())
