"""A sandbox for code that must not be trusted, from Linux namespaces and resource limits.

A sandboxed launch (:func:`reference_impl.comm.launcher.launch` with ``sandbox=``) runs its
ranks in new user, PID, mount, network and IPC namespaces (``unshare(2)``, as bubblewrap and
container runtimes do) with ``setrlimit`` limits, set up before any launched code runs; where
user namespaces are not available, :func:`unavailable` says why. What each namespace hides and
what it does not cover: docs/grading.md, 'Untrusted code: the sandbox'.
"""
from __future__ import annotations

import ctypes
import fcntl
import glob
import os
import resource
import socket
import struct
import sys
import tempfile
from dataclasses import dataclass

from reference_impl.comm.cgroups import TreeCgroup

CLONE_NEWNS, CLONE_NEWIPC = 0x00020000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 0x20, 0x400, 0x800, 0x1000
MS_REC, MS_PRIVATE, MS_RELATIME, MS_STRICTATIME = 0x4000, 0x40000, 0x200000, 0x1000000
_MOUNT_OPTIONS = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC,
                  "noatime": MS_NOATIME, "nodiratime": MS_NODIRATIME,
                  "relatime": MS_RELATIME, "strictatime": MS_STRICTATIME}
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
_CAPABILITY_VERSION_3 = 0x20080522
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
# The devices a rank may open: the harmless ones, and the GPUs (NVIDIA's nodes, the driver's
# control and memory nodes and its capabilities folder among them; DRI; InfiniBand).
DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "nvidia*", "dri", "infiniband")
# Where a machine's services and the caller's own processes keep their sockets (the rank
# server's among them): hidden, with the temporary folder and the user's runtime folder.
SERVICE_FOLDERS = ("/tmp", "/var/tmp", "/run")
PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger")  # the kernel's settings, as containers do
GIB = 1 << 30
THREADS_PER_RANK = 256  # threads a rank may run (its pool, gloo's per group), in the tree's count
_libc = ctypes.CDLL(None, use_errno=True) if os.name == "posix" else None


class SandboxError(RuntimeError):
    """The sandbox could not be set up (the launched code has not run)."""


@dataclass(frozen=True)
class Sandbox:
    """What a sandboxed launch's ranks may reach, and their limits (per process)."""
    writable: tuple[str, ...] = ()  # folders the ranks may write (besides the launch's own)
    readable: tuple[str, ...] = ()  # folders kept visible inside hidden ones
    hidden: tuple[str, ...] = ()  # folders covered by an empty one
    replaced: tuple[tuple[str, str], ...] = ()  # (file, the file read there instead)
    memory_bytes: int | None = None  # writable memory per process (None: a share of half
    #                                  the machine's, at least 2 GiB)
    file_bytes: int = 4 * GIB  # the largest file a rank may write
    processes: int = 512  # processes the ranks may start, besides those the user runs
    cache: str | None = None  # a writable folder that outlives the launch (matplotlib's)
    uid: int | None = None  # no namespaces: a user of the box's own (comm/user_box.py)

    def environment(self, workdir: str) -> dict[str, str]:
        """What a rank's environment gets inside: its temporary files in the launch's folder,
        the backends on the loopback interface (the only one)."""
        return {"TMPDIR": workdir, "GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo",
                "MPLCONFIGDIR": os.path.join(self.cache or workdir, "matplotlib")}


def unavailable() -> str | None:
    """Why a sandbox cannot be made on this machine, or None when it can."""
    if not hasattr(os, "fork") or not os.path.exists("/proc/self/ns/user"):
        return "no Linux user namespaces on this platform"
    return None


def tree_limits(sandbox: Sandbox, ranks: int) -> TreeCgroup | None:
    """Control groups bounding the launch's whole tree, where they can be made here (as root,
    or given a delegated cgroup v2): its processes, which ``RLIMIT_NPROC`` does not bound for
    root, and its memory, each page once and shared memory included. None elsewhere."""
    tree = TreeCgroup.make("kit-sandbox")
    if tree is not None:
        try:
            # The kernel counts threads too: each rank's own (torch's, gloo's) beside it.
            tree.limit("pids", sandbox.processes + ranks * THREADS_PER_RANK + 4)
            tree.limit("memory", _memory_per_process(sandbox, ranks) * (ranks + 2))  # + shm
        except OSError:
            tree.remove()
            return None
    return tree


def enter(sandbox: Sandbox, workdir: str, ranks: int, close_in_host=(),
          tree: TreeCgroup | None = None) -> None:
    """Return in the first process of new namespaces, set up: their process 1. This process
    stays outside as the sandbox's handle (a child of it does, if it has threads: a new user
    namespace takes a process of one thread), closes ``close_in_host``, waits for it and
    exits with its status. With ``tree`` (:func:`tree_limits`), all of it is in that group."""
    if tree is not None:
        tree.join()
    processes = processes_of(os.getuid()) + sandbox.processes
    uid, gid = os.getuid(), os.getgid()  # as the namespace will map them
    held_before = _open_descriptors()
    if len(os.listdir("/proc/self/task")) > 1:  # a new user namespace needs one thread
        _wait_outside(os.fork(), close_in_host)
    unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC,
            what="unshare (new user, mount, PID, network and IPC namespaces)")
    map_to_the_same_user(uid, gid)
    _wait_outside(os.fork(), close_in_host)  # the namespace's process 1 goes on from here
    cwd = os.getcwd()
    _mount_files(sandbox, workdir, _memory_per_process(sandbox, ranks))
    try:
        os.chdir(cwd)  # found again in the new mounts: a hidden folder is no way in
    except OSError:
        os.chdir(workdir)
    _loopback_up()
    limit(sandbox, processes, ranks)
    _drop_capabilities()
    for descriptor in _open_descriptors() - held_before:  # none of the set-up's crosses in
        os.close(descriptor)


def _open_descriptors() -> set[int]:
    """The file descriptors this process holds (not the one that listed them)."""
    listed = [int(name) for name in os.listdir("/proc/self/fd")]
    return {descriptor for descriptor in listed if _is_open(descriptor)}


def _is_open(descriptor: int) -> bool:
    try:
        os.fstat(descriptor)
    except OSError:
        return False
    return True


def _wait_outside(child: int, close_in_host) -> None:
    """In the parent (``child`` > 0): close ``close_in_host``, wait for the child and exit
    with its status. The child returns and goes on."""
    if child == 0:
        die_with_parent()
        return
    for connection in close_in_host:
        connection.close()
    _, status = os.waitpid(child, 0)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (Linux only; elsewhere nothing)."""
    if hasattr(_libc, "prctl"):
        _libc.prctl(PR_SET_PDEATHSIG, 9, 0, 0, 0)


def _call(function, *args, what: str) -> int:
    result = function(*args)
    if result < 0:
        errno = ctypes.get_errno()
        raise SandboxError(f"{what} failed: {os.strerror(errno)} (errno {errno})")
    return result


def unshare(flags: int, what: str) -> None:
    """``unshare(2)`` with ``flags`` (``CLONE_NEW...``), or a SandboxError saying ``what``."""
    _call(_libc.unshare, flags, what=what)


def mount(source, target, kind, flags, data=None, what=None) -> None:
    """``mount(2)``, or a SandboxError saying ``what`` failed and why."""
    _call(_libc.mount, _bytes(source), _bytes(target), _bytes(kind), ctypes.c_ulong(flags),
          _bytes(data), what=what or f"mount {target}")


def _bytes(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def map_to_the_same_user(uid: int, gid: int) -> None:
    """Inside, the user is who it was outside (uid and gid), and nothing more."""
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"),
                       ("gid_map", f"{gid} {gid} 1")):
        handle = os.open(f"/proc/self/{name}", os.O_WRONLY)  # one write, no truncation
        try:
            os.write(handle, text.encode())
        finally:
            os.close(handle)


def _mount_files(sandbox: Sandbox, workdir: str, shared_memory: int) -> None:
    mount(None, "/", None, MS_REC | MS_PRIVATE, what="make / private")
    if sandbox.cache:
        os.makedirs(sandbox.cache, exist_ok=True)
    writable = [os.path.realpath(path) for path in (workdir, *sandbox.writable, sandbox.cache)
                if path]
    hidden = list(dict.fromkeys(os.path.realpath(path) for path in (
        *sandbox.hidden, *SERVICE_FOLDERS, tempfile.gettempdir(),
        os.environ.get("XDG_RUNTIME_DIR")) if path))
    readable = [os.path.realpath(path) for path in (*sandbox.readable, *_needed_to_run())
                if os.path.isabs(path) and os.path.exists(path)]
    # What stays visible inside a hidden folder (but not a hidden folder itself), bound back.
    exposed = sorted(set(writable + [path for path in readable
                                     if _within(path, hidden) and path not in hidden]))
    devices = sorted({path for name in DEVICES for path in glob.glob(os.path.join("/dev", name))})
    # Reach what stays visible by file descriptor, before hiding folders above it; each one
    # is closed before any launched code runs (through one, a rank could walk to `..`).
    handles, replacements = {}, []
    try:
        for path in [*exposed, *devices]:
            handles[path] = os.open(path, os.O_PATH | os.O_CLOEXEC)
        for target, instead in sandbox.replaced:  # each reached through its stand-in
            replacements.append((os.path.realpath(target),
                                 os.open(instead, os.O_PATH | os.O_CLOEXEC)))
        # Outermost first (a folder hidden before one bound back at the same place), so each
        # hides or shows what lies under it: a folder hidden inside one bound back (the kit's
        # tests, with the kit under /tmp) is hidden again, one bound back inside that shown.
        steps = [(path, 0) for path in hidden] + [(path, 1) for path in exposed]
        for path, show in sorted(steps):
            if show:
                _bind_from(handles[path], path)
            elif os.path.isdir(path):  # a folder under a hidden one is gone already
                mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=1m")
        mount("tmpfs", "/dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755",
               what="a /dev of its own")
        for path in devices:
            _bind_from(handles[path], path)
        for path, handle in replacements:  # last: over what holds their targets
            _bind_from(handle, path)
    finally:
        for handle in [*handles.values(), *(handle for _, handle in replacements)]:
            os.close(handle)
    os.makedirs("/dev/shm")
    # Shared memory escapes a process's limit: the launch's, all of it, holds one process's.
    mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV,
           f"mode=1777,size={shared_memory}", what="a /dev/shm of its own")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, os.path.join("/dev", name))
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
           what="a /proc of the new PID namespace")
    for path in PROC_READ_ONLY:
        if os.path.exists(path):
            mount(path, path, None, MS_BIND | MS_REC)
    for target, options in _mounts():
        if _within(target, writable + ["/dev/shm"]) or (
                _within(target, ["/proc"]) and not _within(target, PROC_READ_ONLY)):
            continue
        _read_only(target, options)


def _needed_to_run() -> list[str]:
    """What a rank must still read wherever it lies: the interpreter's folders, the kit's and
    every folder it imports from."""
    kit = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return [sys.prefix, sys.base_prefix, kit, *sys.path]


def _within(path: str, folders) -> bool:
    return any(path == folder or path.startswith(folder.rstrip("/") + "/") for folder in folders)


def _bind_from(handle: int, path: str) -> None:
    """Bind the file or folder open as ``handle`` at ``path``, making the place for it."""
    if os.path.isdir(f"/proc/self/fd/{handle}"):
        os.makedirs(path, exist_ok=True)
    elif not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        open(path, "w").close()
    mount(f"/proc/self/fd/{handle}", path, None, MS_BIND | MS_REC, what=f"bind {path}")


def _mounts() -> list[tuple[str, str]]:
    """(mount point, its options) of every mount in reach: not covered by a later mount on
    it or on a folder above it."""
    found = []
    with open("/proc/self/mountinfo") as handle:
        for line in handle:
            fields = line.split()
            target = fields[4].encode().decode("unicode_escape")  # \040 is a space
            found.append((target, fields[5]))
    return [(target, options) for index, (target, options) in enumerate(found)
            if not any(_within(target, [later]) for later, _ in found[index + 1:])]


def _read_only(target: str, options: str) -> None:
    """Remount ``target`` read-only, keeping the flags a user namespace may not clear."""
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY
    for option in options.split(","):
        flags |= _MOUNT_OPTIONS.get(option, 0)
    mount(None, target, None, flags, what=f"make {target} read-only")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(probe, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _memory_per_process(sandbox: Sandbox, ranks: int) -> int:
    """``memory_bytes``, or a share of half the machine's memory (at least 2 GiB)."""
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return sandbox.memory_bytes or max(2 * GIB, machine // (2 * ranks))


def limit(sandbox: Sandbox, processes: int, ranks: int) -> None:
    """The per-process limits: writable memory, file size, no core files, ``processes``."""
    memory = _memory_per_process(sandbox, ranks)
    for kind, value in ((resource.RLIMIT_DATA, memory), (resource.RLIMIT_FSIZE, sandbox.file_bytes),
                        (resource.RLIMIT_CORE, 0), (resource.RLIMIT_NPROC, processes)):
        hard = resource.getrlimit(kind)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(kind, (value, value))


def processes_of(uid: int, running_only: bool = False) -> int:
    """How many processes user ``uid`` runs now (a process limit counts them all, ended ones
    not yet reaped included, unless ``running_only``)."""
    count = 0
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            with open(status) as handle:
                lines = handle.read().splitlines()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in lines if ":" in line)
        count += (fields.get("Uid", "").split()[:1] == [str(uid)]
                  and not (running_only and fields.get("State", "").split()[:1] == ["Z"]))
    return count


def _drop_capabilities() -> None:
    """No capability from here on, nor after an exec (a rank must not undo its mounts)."""
    for capability in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) < 0:
            break  # past the last capability this kernel knows
    no_new_privileges()
    header = struct.pack("Ii", _CAPABILITY_VERSION_3, 0)
    data = ctypes.create_string_buffer(24)  # two (effective, permitted, inheritable): all 0
    _call(_libc.capset, ctypes.c_char_p(header), data, what="capset (drop capabilities)")


def no_new_privileges() -> None:
    """No exec from here on gains a privilege (a setuid program, file capabilities)."""
    _call(_libc.prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, what="prctl(PR_SET_NO_NEW_PRIVS)")
