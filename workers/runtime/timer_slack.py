"""The worker process's timer slack: how late Linux may end a timed wait of its threads.

Linux lets a timed sleep or a wait with a timeout end up to a thread's timer slack late (50 µs
by default) so that wake-ups can be coalesced. A worker times waits far shorter than a
millisecond (a finished batch's yield to the next batch's claim, the read ahead of late
joiners before the running call's expected end), and a model waiting on its device may too:
50 µs is a quarter of the hand-over's yield and ~2% of a 2.6 ms batch
(``benchmarks/README.md``). A thread takes the slack of the thread that starts it.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

PR_SET_TIMERSLACK = 29  # from <linux/prctl.h>
WORKER_TIMER_SLACK_NS = 1_000


def tighten_timer_slack(slack_ns: int = WORKER_TIMER_SLACK_NS) -> bool:
    """Sets the calling thread's timer slack to ``slack_ns``, and so that of every thread it
    starts afterwards; True when set. Elsewhere than on Linux it is left as it is, and where
    Linux refuses it too (logged): timed waits then end as late as the system lets them."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    unused = ctypes.c_ulong(0)
    if libc.prctl(PR_SET_TIMERSLACK, ctypes.c_ulong(slack_ns), unused, unused, unused) != 0:
        log.warning("timer slack left as it was: prctl failed (errno %d)", ctypes.get_errno())
        return False
    return True
