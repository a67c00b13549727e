"""The seccomp filter every sandboxed program runs under (stdlib only; runs inside the sandbox).

A classic-BPF program built here with `ctypes` and loaded with `prctl(PR_SET_SECCOMP)`: the
sandbox runs the system interpreter with no site-packages, so libseccomp's Python bindings are
not importable there, and the filter is small enough to write out. It denies, with EPERM, the
syscall classes a test program never needs and that carry most of the kernel's attack surface:

- io_uring (`io_uring_setup/enter/register`), keyrings (`keyctl`, `add_key`, `request_key`),
  `bpf`, `perf_event_open`, `userfaultfd`;
- other processes' memory and fds (`ptrace`, `process_vm_readv/writev`, `pidfd_getfd`,
  `process_madvise`);
- the kernel and the machine (`kexec_*`, `*_module`, `reboot`, `swapon/off`, `syslog`, `acct`,
  clock setting, `quotactl*`, `lookup_dcookie`, `vhangup`, x86 `iopl/ioperm/modify_ldt`, ...);
- mounts and namespaces (`mount`, `umount2`, `pivot_root`, `chroot`, the new mount API,
  `unshare`, `setns`, and `clone` with any namespace flag); `clone3`, whose flags live in
  memory a filter cannot read, gets ENOSYS so that the C library falls back to `clone`;
- file handles (`name_to_handle_at`, `open_by_handle_at`), `fanotify_init`.

A syscall from another ABI (x32 numbers, 32-bit compat) kills the process. `install()` raises
`OSError` when the kernel refuses the filter; the sandbox reports that as its own failure.
"""

from __future__ import annotations

import ctypes
import os
import platform
import struct

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
_EPERM, _ENOSYS = 1, 38
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_X32_SYSCALL_BIT = 0x40000000

CLONE_NAMESPACE_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
CLONE_NAMESPACE_FLAGS |= 0x20000000 | 0x40000000
"""NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET (NEWTIME only exists for clone3)."""

DENIED = (
    "io_uring_setup io_uring_enter io_uring_register keyctl add_key request_key bpf "
    "perf_event_open userfaultfd ptrace process_vm_readv process_vm_writev pidfd_getfd "
    "process_madvise kexec_load kexec_file_load init_module finit_module delete_module mount "
    "umount2 pivot_root chroot open_tree move_mount fsopen fsconfig fsmount fspick mount_setattr "
    "unshare setns reboot swapon swapoff syslog acct settimeofday clock_settime clock_adjtime "
    "adjtimex name_to_handle_at open_by_handle_at fanotify_init quotactl quotactl_fd "
    "lookup_dcookie vhangup iopl ioperm modify_ldt uselib _sysctl"
).split()
"""Syscalls refused with EPERM (those an architecture lacks are skipped)."""

# (audit arch, syscall numbers). Checked against the kernel headers (asm/unistd_64.h and
# asm-generic/unistd.h).
_TABLES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (
        0xC000003E,
        {
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "keyctl": 250,
            "add_key": 248,
            "request_key": 249,
            "bpf": 321,
            "perf_event_open": 298,
            "userfaultfd": 323,
            "ptrace": 101,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "pidfd_getfd": 438,
            "process_madvise": 440,
            "kexec_load": 246,
            "kexec_file_load": 320,
            "init_module": 175,
            "finit_module": 313,
            "delete_module": 176,
            "mount": 165,
            "umount2": 166,
            "pivot_root": 155,
            "chroot": 161,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "unshare": 272,
            "setns": 308,
            "reboot": 169,
            "swapon": 167,
            "swapoff": 168,
            "syslog": 103,
            "acct": 163,
            "settimeofday": 164,
            "clock_settime": 227,
            "clock_adjtime": 305,
            "adjtimex": 159,
            "name_to_handle_at": 303,
            "open_by_handle_at": 304,
            "fanotify_init": 300,
            "quotactl": 179,
            "quotactl_fd": 443,
            "lookup_dcookie": 212,
            "vhangup": 153,
            "iopl": 172,
            "ioperm": 173,
            "modify_ldt": 154,
            "uselib": 134,
            "_sysctl": 156,
            "clone": 56,
            "clone3": 435,
        },
    ),  # fmt: skip
    "aarch64": (
        0xC00000B7,
        {
            "io_uring_setup": 425,
            "io_uring_enter": 426,
            "io_uring_register": 427,
            "keyctl": 219,
            "add_key": 217,
            "request_key": 218,
            "bpf": 280,
            "perf_event_open": 241,
            "userfaultfd": 282,
            "ptrace": 117,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "pidfd_getfd": 438,
            "process_madvise": 440,
            "kexec_load": 104,
            "kexec_file_load": 294,
            "init_module": 105,
            "finit_module": 273,
            "delete_module": 106,
            "mount": 40,
            "umount2": 39,
            "pivot_root": 41,
            "chroot": 51,
            "open_tree": 428,
            "move_mount": 429,
            "fsopen": 430,
            "fsconfig": 431,
            "fsmount": 432,
            "fspick": 433,
            "mount_setattr": 442,
            "unshare": 97,
            "setns": 268,
            "reboot": 142,
            "swapon": 224,
            "swapoff": 225,
            "syslog": 116,
            "acct": 89,
            "settimeofday": 170,
            "clock_settime": 112,
            "clock_adjtime": 266,
            "adjtimex": 171,
            "name_to_handle_at": 264,
            "open_by_handle_at": 265,
            "fanotify_init": 262,
            "quotactl": 60,
            "quotactl_fd": 443,
            "lookup_dcookie": 18,
            "vhangup": 58,
            "clone": 220,
            "clone3": 435,
        },
    ),  # fmt: skip
}

# Classic BPF opcodes and struct seccomp_data offsets.
_LD_ABS_W, _JEQ_K, _JGE_K, _JSET_K, _RET_K = 0x20, 0x15, 0x35, 0x45, 0x06
_OFF_NR, _OFF_ARCH, _OFF_ARG0_LOW = 0, 4, 16


def supported() -> str | None:
    """None when this machine has a syscall table here and seccomp filters, else why not."""
    if platform.machine() not in _TABLES:
        return f"no syscall table for {platform.machine()} (only {', '.join(_TABLES)})"
    try:
        with open("/proc/self/status") as status:
            if not any(line.startswith("Seccomp:") for line in status):
                return "the kernel has no seccomp (CONFIG_SECCOMP_FILTER)"
    except OSError as err:
        return f"cannot read /proc/self/status: {err}"
    return None


def build(machine: str | None = None) -> bytes:
    """The filter as an array of `struct sock_filter` (8 bytes each)."""
    arch, numbers = _TABLES[machine or platform.machine()]
    program: list[tuple[int, int, int, object]] = []  # (code, jt, jf, k), jumps by label

    def emit(code: int, k: object, jt: object = 0, jf: object = 0) -> None:
        program.append((code, jt, jf, k))  # type: ignore[arg-type]

    emit(_LD_ABS_W, _OFF_ARCH)
    emit(_JEQ_K, arch, 1, 0)
    emit(_RET_K, SECCOMP_RET_KILL_PROCESS)
    emit(_LD_ABS_W, _OFF_NR)
    if arch == _TABLES["x86_64"][0]:
        emit(_JGE_K, _X32_SYSCALL_BIT, "kill", 0)
    for name in DENIED:
        if name in numbers:
            emit(_JEQ_K, numbers[name], "deny", 0)
    emit(_JEQ_K, numbers["clone"], "clone", 0)
    emit(_JEQ_K, numbers["clone3"], "enosys", 0)
    labels = {"allow": len(program)}
    emit(_RET_K, SECCOMP_RET_ALLOW)
    labels["clone"] = len(program)
    emit(_LD_ABS_W, _OFF_ARG0_LOW)
    emit(_JSET_K, CLONE_NAMESPACE_FLAGS, "deny", 0)
    emit(_RET_K, SECCOMP_RET_ALLOW)
    labels["deny"] = len(program)
    emit(_RET_K, SECCOMP_RET_ERRNO | _EPERM)
    labels["enosys"] = len(program)
    emit(_RET_K, SECCOMP_RET_ERRNO | _ENOSYS)
    labels["kill"] = len(program)
    emit(_RET_K, SECCOMP_RET_KILL_PROCESS)

    out = bytearray()
    for pc, (code, jt, jf, k) in enumerate(program):
        jumps = [labels[j] - pc - 1 if isinstance(j, str) else j for j in (jt, jf)]
        assert all(0 <= j <= 255 for j in jumps), "filter jump out of range"
        out += struct.pack("=HBBI", code, jumps[0], jumps[1], int(k))  # type: ignore[call-overload]
    return bytes(out)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def install(program: bytes | None = None) -> None:
    """Load the filter into the calling thread (and everything it later starts). Sets
    no_new_privs first (required without CAP_SYS_ADMIN; the sandbox sets it anyway)."""
    program = program if program is not None else build()
    libc = ctypes.CDLL(None, use_errno=True)
    buffer = ctypes.create_string_buffer(program, len(program))
    fprog = _SockFprog(len(program) // 8, ctypes.cast(buffer, ctypes.c_void_p))
    for args in (
        (_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0),
        (_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog)),
    ):
        if libc.prctl(*args) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"seccomp: prctl{args[:1]}: {os.strerror(err)}")
