"""What a kernel log's lines look like, faults or not: the prefixes the tools that print it put before a message,
and the shape of the kernel's own messages. Pure: ``diagnose`` decides with it whether a paste is a kernel log.

The prefixes, each as this machine's util-linux 2.38 or journald print it (tests/fixtures/kernel_log/healthy):

    [22613.843586] dgxd-fm-br: port 2(dgxd-fm-vb) entered disabled state                    dmesg
    [Sat Dec  5 14:43:11 2026] dgxd-fm-br: port 2(dgxd-fm-vb) entered disabled state         dmesg -T
    2026-12-05T14:43:11,881860+00:00 dgxd-fm-br: port 2(dgxd-fm-vb) entered disabled state   dmesg --time-format=iso
    <6>[22613.843586] dgxd-fm-br: ...                                                          dmesg -r
    kern  :info  : [22613.843586] dgxd-fm-br: ...                                              dmesg -x
    6,1234,22613843586,-;dgxd-fm-br: ...                                                       /dev/kmsg
    Jun 30 21:12:14 localhost kernel: x86/fpu: Supporting XSAVE feature 0x001: ...           journalctl -k, syslog
    2026-12-05T08:00:01.123456+00:00 gpu-0 kernel: ...                                       rsyslog RFC 3339
    [    0.000000][    T0] Linux version 6.1.0 ...                                            CONFIG_PRINTK_CALLER

The last four name the kernel (``kernel:``, the ``kern`` facility, a record of facility 0); the dmesg stamps alone
do not, so a stamped line counts as the kernel's only beside a message of the kernel's shape: a subsystem or device
prefix (``pci 0000:00:01.0: ``, ``mlx5_core 0000:53:00.0 mlx5_3: ``, ``EXT4-fs (sda1): ``, ``x86/fpu: ``) or one of
the boot's own headlines (``Linux version``, ``Command line:``).
"""

from __future__ import annotations

from dgxdoctor.lazy_re import lazy_compile

_DOW = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_MON = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_MONOTONIC = r"\[\s{0,12}\d{1,10}\.\d{1,9}\]"
_CALLER = r"(?:\[\s{0,7}[TC]\d{1,7}\])?"

# A dmesg stamp (monotonic, -T's ctime, --time-format=iso), with -r's priority (facility 0: 0-7) before it.
STAMPED_RE = lazy_compile(
    r"^(?:<[0-7]>)?(?:" + _MONOTONIC + r"|\[" + _DOW + r" " + _MON + r" [ \d]\d \d\d:\d\d:\d\d \d{4}\]"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{6}[+-]\d\d:\d\d)" + _CALLER + r" ?"
)
# A prefix that names the kernel: syslog's and journalctl's "host kernel: " (the host may be missing, the stamp may
# carry a fraction or be RFC 3339), dmesg -x's "kern  :info  : ", a /dev/kmsg record of facility 0.
NAMED_RE = lazy_compile(
    r"^(?:(?:" + _MON + r" [ \d]\d \d\d:\d\d:\d\d(?:\.\d{1,9})?"
    r"|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:[.,]\d{1,9})?(?:Z|[+-]\d\d:?\d\d)?) (?:\S{1,255} )?kernel: "
    r"|kern {0,2}:\w{1,6} {0,2}: "
    r"|[0-7],\d{1,20},\d{1,20},[-c+][^;\n]{0,40};)"
)
# The message itself, after any stamp: a subsystem or device prefix ("pci 0000:00:1c.0: ", "dgxh0-br: ",
# "EXT4-fs (sda1): ", "[Firmware Bug]: ") or a headline of the boot.
KERNEL_MESSAGE_RE = lazy_compile(
    r"(?:[A-Za-z_][\w.\-/+]{0,39}(?: \S{1,64}){0,2}?: \S"
    r"|\[[\w ]{1,30}\]:? \S"
    r"|(?:Linux version|Command line:|Kernel command line:|Booting Linux|Freeing unused|Run /|Memory: )"
    r")"
)


def kernel_line(line: str) -> bool | None:
    """Whether ``line`` carries a kernel log's prefix: True when the prefix names the kernel or the message after a
    dmesg stamp has the kernel's shape, False for a stamp before some other text, None for no prefix at all."""
    if NAMED_RE.match(line) is not None:
        return True
    stamp = STAMPED_RE.match(line)
    if stamp is None:
        return None
    return KERNEL_MESSAGE_RE.match(line, stamp.end()) is not None
