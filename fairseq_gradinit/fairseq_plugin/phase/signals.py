"""SIGTERM handled like Ctrl-C while GradInit runs, so that a stopped job ends cleanly."""
import contextlib
import signal
import threading


class Interrupted(KeyboardInterrupt):
    """KeyboardInterrupt raised by a signal other than SIGINT; ``signum`` names it."""

    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def sigterm_raises_interrupt():
    """SIGTERM (a scheduler stopping the job) raises like Ctrl-C does, so GradInit stops cleanly."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
