import sys

from meshrl_cli import main

sys.exit(main())
