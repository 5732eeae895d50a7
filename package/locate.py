"""``python -m dualsched.package.locate``: the plugin directory, as ``dualsched-package-dir`` prints it."""

import sys

from dualsched.package import main

if __name__ == "__main__":
    sys.exit(main())
