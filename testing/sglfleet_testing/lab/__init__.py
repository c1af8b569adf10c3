"""The local lab: fakepve on https://127.0.0.1:8006 whose containers are real LXC containers.

`python -m sglfleet_testing.lab up|down|status` (make lab-up / lab-down / lab-status). See settings
for where it keeps its state, service for the commands, pve for the API bridge, container for the LXC
side, template for the OS template and hostaccess for the package access containers take with them.
"""

from .settings import LabSettings

__all__ = ["LabSettings"]
