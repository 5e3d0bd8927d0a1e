"""One module per pipeline; each flow reads like its seed's diagram."""

from tasks.core.runtime import quick_heartbeat_exit

quick_heartbeat_exit()
