"""The guest inside a simulated server: what osas's user data does at every boot, and the
console log Nova's ``os-getConsoleOutput`` reads.

The guest follows the warm-pool contract between osas and its user data (the per-boot script):

- at every boot it reads the server's metadata, as the script reads the metadata service's
  ``meta_data.json``; what the metadata says later changes that boot only where the script
  reads it again (an idle guest waiting for its claim, the second read below);
- with the warm mark (``osas-warm``) it prepares (packages, images), once per disk: a boot
  after a preparation that finished skips the work but not the rest. Every warm boot, after
  ``FakeNova.warm_prepare_seconds`` (the preparation, or the skip of it, and the script's own
  start), prints ``osas-warm-prepared`` on the console, then:

  - for ``osas-warm-state`` shutoff or absent, the boot that prepared powers itself off at
    once. A later warm boot (the preparation done before: a host's reboot, or a start for a
    claim whose first read saw the metadata it had while warm, as the real script may from
    the metadata service's cache) waits another ``warm_prepare_seconds`` (the real script's
    20 s), reads the metadata again and powers off only if the mark is still there; gone,
    it joins. The simulator has no such cache: the re-read matters when the metadata is
    replaced after the boot;
  - for paused, suspended and shelved_offloaded it stays up, idle, until the warm mark is
    gone from the metadata while it runs, and then joins (a claimed server is unpaused or
    resumed with new metadata; an offloaded one, Nova refusing metadata writes on it, is
    unshelved first: it boots with the mark still on, prints the marker again and waits for
    the new metadata osas writes once it runs);
- without the warm mark (a claimed server, a cold create) it joins the cluster at boot unless
  it joined before (kubelet.conf on its disk): the console gains ``osas-node-joined``.

The preparation can hang (``Faults.warm_prepare_hangs``): that boot never prints the marker
nor powers off; a later boot prepares again. A step of the script (the preparation, the wait
before the re-read) ends when it is due or, if the guest is paused then or Nova acts on the
server, as soon as it runs again with no task under way.

The console is what Nova's libvirt driver shows for a kvm guest with its default pty console:
the log virtlogd writes with Nova's ``append="off"``, truncated whenever a QEMU process starts
(every power-on, an unshelve, the resume of a suspended server), kept across pause; readable
only while that process runs (``running``), else Nova answers 404 "Guest does not have a
console available." (unless ``FakeNova.serial_console``: with Nova's serial console the log
file is named in the domain's inactive definition too, so the last run's log is read).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

# The metadata keys and console lines of the contract (notes: warm pools, issue 36).
WARM_MARK = "osas-warm"
WARM_STATE = "osas-warm-state"
PREPARED_LINE = "osas-warm-prepared"
JOINED_LINE = "osas-node-joined"
# The pool states in which a prepared guest stays up; in any other it powers itself off.
_STAYS_UP = frozenset({"paused", "suspended", "shelved_offloaded"})
# Nova's libvirt driver reads at most the last 100 KiB of the log (MAX_CONSOLE_BYTES).
MAX_CONSOLE_BYTES = 100 * 1024
CONSOLE_NOT_AVAILABLE = "Guest does not have a console available."  # ConsoleNotAvailable


def boot_lines(name: str, server_id: str) -> list[str]:
    """What a boot writes on the serial console before the user data runs (the simulator's own
    kernel and cloud-init lines, not any real image's)."""
    hostname = name.lower()
    return [
        "[    0.000000] Linux version 6.1.0-osas-sim (sim@osas) #1 SMP PREEMPT_DYNAMIC",
        "[    0.000000] Command line: root=LABEL=cloudimg-rootfs ro console=tty1 console=ttyS0",
        "[    0.917204] virtio_net virtio1 ens3: renamed from eth0",
        "[    2.304511] systemd[1]: Reached target basic.target - Basic System.",
        f"[    3.118962] cloud-init[433]: instance {server_id} is {hostname}",
        f"[    4.775130] cloud-init[611]: running the per-boot user data of {hostname}",
    ]


_POWER_OFF_LINES = (
    "[  OK  ] Reached target poweroff.target - System Power Off.",
    "[   12.480733] reboot: Power down",
)


@dataclass(slots=True)
class Guest:
    """One server's guest: its console log, whether its QEMU process runs, what its disk keeps
    (prepared, joined) and the boot script's work still to come. Small, as every server of a
    large simulated cloud has one: the boot lines are written out only when the log is read."""

    # The log of the current (or last) run: the boot lines if it began with a boot, then what
    # the guest wrote since.
    booted: bool = False
    lines: tuple[str, ...] = ()
    running: bool = False  # a QEMU process runs, paused or not: the pty console is there
    prepared: bool = False  # /var/lib/osas/prepared
    joined: bool = False  # /etc/kubernetes/kubelet.conf
    # The boot script's warm step: when it ends (real clock), and whether it then powers off.
    due: datetime | None = None
    powers_off: bool = False
    # A later warm boot, the marker printed: at ``due`` it reads the metadata again, then
    # powers off (still warm) or joins (claimed).
    rechecks: bool = False
    idle: bool = False  # prepared, up, waiting for the warm mark to go
    # It powered itself off, its instance still ACTIVE: Nova's power-state sync records the
    # domain's power state (4, shutdown) and calls its stop API.
    powered_off: bool = False

    def boot(
        self, metadata: Mapping[str, str], at: datetime, *, seconds: float, hangs: bool
    ) -> None:
        """A QEMU process starts and the guest boots at ``at`` (real clock): the log starts
        afresh, the boot script reads the metadata. ``hangs``: whether a preparation this boot
        runs never ends (asked only of a boot that prepares)."""
        self.booted, self.lines = True, ()
        self.running = True
        self.idle = self.powered_off = self.rechecks = False
        self.due = None
        if WARM_MARK not in metadata:
            self.join()
            return
        self.powers_off = metadata.get(WARM_STATE) not in _STAYS_UP
        if self.prepared or not hangs:
            self.due = at + timedelta(seconds=seconds)

    def finish_warm_step(
        self, metadata: Mapping[str, str], at: datetime, *, recheck_seconds: float
    ) -> bool:
        """The boot script's warm step ends at ``at`` (real clock). True when the guest then
        powers itself off (it has: ``running`` is False), False when it goes on (idle,
        waiting to read the metadata again, or joined).

        The preparation (or its skip) ends: prepared, the marker printed; the guest stays up
        idle (a pool kept paused, suspended or offloaded), powers off (the boot that
        prepared), or, a later boot, waits ``recheck_seconds`` before it reads the metadata
        again. The wait ends: ``metadata`` is that second read; still warm, the guest powers
        off; claimed, it joins."""
        self.due = None
        if self.rechecks:
            self.rechecks = False
            if WARM_MARK in metadata:
                return self._power_off()
            self.join()
            return False
        again = self.prepared
        self.prepared = True
        self.lines += (PREPARED_LINE,)
        if not self.powers_off:
            self.idle = True
            return False
        if again:
            self.rechecks = True
            self.due = at + timedelta(seconds=recheck_seconds)
            return False
        return self._power_off()

    def _power_off(self) -> bool:
        self.lines += _POWER_OFF_LINES
        self.running = False
        self.powered_off = True
        return True

    def join(self) -> None:
        """Join the cluster, unless the disk says it did."""
        self.idle = False
        if not self.joined:
            self.joined = True
            self.lines += (JOINED_LINE,)

    def sees(self, metadata: Mapping[str, str]) -> None:
        """An idle guest, running, looks at the metadata: claimed (no warm mark), it joins."""
        if self.idle and self.running and WARM_MARK not in metadata:
            self.join()

    def halt(self) -> None:
        """The QEMU process ends and the guest with it (stopped, shelved, deleted): whatever
        its boot script still had to do is lost."""
        self.running = self.idle = self.powered_off = self.rechecks = False
        self.due = None

    def freeze(self) -> None:
        """Suspended: the QEMU process saves the guest's memory and ends; the guest's work goes
        on where it was when it is resumed."""
        self.running = False

    def thaw(self) -> None:
        """Resumed: a new QEMU process (the log starts afresh) restores the guest."""
        self.booted, self.lines = False, ()
        self.running = True

    def log_lines(self, name: str, server_id: str) -> list[str]:
        """Every line of the log, the server's name and id written into its boot lines."""
        return (boot_lines(name, server_id) if self.booted else []) + list(self.lines)

    def log(self, name: str, server_id: str) -> str:
        """The log as the driver reads it: every line ended, the last MAX_CONSOLE_BYTES."""
        text = "".join(f"{line}\n" for line in self.log_lines(name, server_id))
        return text[-MAX_CONSOLE_BYTES:]


def tail(log: str, length: int | None) -> str:
    """Nova's compute manager's tail of a console log: None is all of it, 0 nothing, else the
    log split at newlines and sliced from ``-length`` (so a log ending with a newline gives
    ``length - 1`` lines and an empty last one, and -1, which Nova's schema calls unlimited,
    slices from 1: every line but the first)."""
    if length is None:
        return log
    if length == 0:
        return ""
    return "\n".join(log.split("\n")[-length:])


def seeded_guest(metadata: Mapping[str, str], status: str) -> Guest:
    """The guest of a server seeded in ``status``: past its boot script, as the metadata says
    it left it (a warm one prepared and, if it runs, idle with the marker on its console; any
    other joined)."""
    if status in {"BUILD", "ERROR", "DELETED"}:
        return Guest()  # never booted (a BUILD one boots when its build ends)
    warm = WARM_MARK in metadata
    return Guest(
        booted=True,
        lines=(PREPARED_LINE,) if warm else (),
        running=status in {"ACTIVE", "PAUSED"},
        prepared=warm,
        joined=not warm,
        idle=warm and status in {"ACTIVE", "PAUSED", "SUSPENDED"},
    )
