"""A job-control shell stand-in on a pty: runs one command as the terminal's foreground job.

    python pty_shell.py {tostop|plain} ARGV...

Started as a session leader with a pty slave on 0/1/2, it makes that pty its
controlling terminal, sets or clears `stty tostop`, starts ARGV in a process group of
its own and hands it the terminal, as bash does. It prints `shell: job exited N` when
the job ends, then stays (the terminal's session lives on) until killed.
"""

from __future__ import annotations

import fcntl
import os
import signal
import sys
import termios
import time

JOB_CONTROL_SIGNALS = (signal.SIGTTOU, signal.SIGTTIN, signal.SIGTSTP, signal.SIGINT)


def main() -> None:
    mode, argv = sys.argv[1], sys.argv[2:]
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    for number in JOB_CONTROL_SIGNALS:
        signal.signal(number, signal.SIG_IGN)
    attributes = termios.tcgetattr(0)
    if mode == "tostop":
        attributes[3] |= termios.TOSTOP
    else:
        attributes[3] &= ~termios.TOSTOP
    termios.tcsetattr(0, termios.TCSANOW, attributes)
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        os.tcsetpgrp(0, os.getpid())
        for number in JOB_CONTROL_SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        os.execv(argv[0], argv)
    try:
        os.setpgid(pid, pid)
        os.tcsetpgrp(0, pid)
    except OSError:
        pass  # the child got there first
    _, status = os.waitpid(pid, 0)
    os.tcsetpgrp(0, os.getpgrp())
    print(f"shell: job exited {os.waitstatus_to_exitcode(status)}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
