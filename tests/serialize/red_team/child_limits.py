"""Per-file limits of the red team's child processes (``red_team_runner``, ``generative_driver``).

Each hostile file gets its own budget, above what the warm interpreter already holds: CPU
seconds (``RLIMIT_CPU``: a file that loops is killed by SIGXCPU, and the parent names it) and
address space (``RLIMIT_AS``: an allocation past it fails with MemoryError). ``lift_limits``
gives the process its full budget back between files.
"""

from __future__ import annotations

import io
import resource

_open = io.open  # taken at import, before a runner replaces open with its recorder


def vm_bytes() -> int:
    """The address space the process holds now."""
    with _open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def set_limits(cpu_seconds: int, memory_bytes: int) -> None:
    """From now on, at most ``cpu_seconds`` more of CPU and ``memory_bytes`` more of memory."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = int(usage.ru_utime + usage.ru_stime) + cpu_seconds + 1
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, resource.getrlimit(resource.RLIMIT_CPU)[1]))
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + memory_bytes, hard))


def lift_limits() -> None:
    for limit in (resource.RLIMIT_AS, resource.RLIMIT_CPU):
        hard = resource.getrlimit(limit)[1]
        resource.setrlimit(limit, (hard, hard))
