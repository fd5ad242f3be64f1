"""A real Slurm cluster on this machine, for tests: munged, slurmctld and several slurmd.

Debian's ``slurm-wlm`` runs several slurmd on one host: each is a node of its own
(``NodeName=... NodeAddr=127.0.0.1 Port=<its own>``, started as ``slurmd -N <name>``), with its
own spool directory and log. Everything lives under one temporary directory, every daemon
listens on a free port (never Slurm's defaults), and the names are unique per cluster (cluster,
nodes; with proctrack/cgroup Slurm's cgroup directories are named after the nodes), so two
test runs on one machine do not meet. ``stop`` cancels what is still queued, then terminates and
kills the daemons it started, by pid.

Processes of the jobs are tracked with proctrack/cgroup (cgroup v1: the freezer hierarchy
must be writable, ``cgroup_v1_writable``), as on the production clusters this targets: Slurm
then signals each step's task process, not its children, which deploy/slurm's stop relies on.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scancel", "squeue", "scontrol")
FREEZER = Path("/sys/fs/cgroup/freezer")


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_ports(n: int = 1) -> int:
    """A port p with p .. p + n - 1 free now, below the kernel's ephemeral range: the jobs
    bind them seconds later, and a port the kernel hands out meanwhile (a learner's TCPStore
    binding port 0, a connection's source port) is never one of them (it took a server's port
    once, and the server could not start)."""
    top = _ephemeral_start() - n
    for _ in range(500):
        p = random.randrange(20000, top)
        if all(_bindable(p + i) for i in range(n)):
            return p
    raise RuntimeError(f"no {n} consecutive free ports found below {top + n}")


def free_port() -> int:
    return free_ports(1)


def free_port_pair() -> int:
    """A port p with p and p + 1 free (two servers of one step listen on base + i)."""
    return free_ports(2)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def missing_programs() -> list[str]:
    return [d for d in DAEMONS if shutil.which(d) is None]


def wait_for(cond: Callable[[], bool], what: str, timeout: float, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for {what}")
        time.sleep(every)


def cgroup_v1_writable() -> bool:
    if not FREEZER.is_dir():
        return False
    probe = FREEZER / f"gspo-probe-{os.getpid()}-{secrets.token_hex(3)}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


class SlurmCluster:
    """``nodes`` slurmd on this host, each with ``cpus`` CPUs and ``mem_mb`` of memory as
    Slurm sees them (``SlurmdParameters=config_overrides``: declared, not measured; the jobs
    here are sized for the scheduler, and share the machine's real cores)."""

    def __init__(self, root: Path, nodes: int = 4, cpus: int = 4, mem_mb: int = 6000,
                 kill_wait_s: int = 60) -> None:
        self.root = root
        self.token = secrets.token_hex(3)
        self.name = f"gspo{self.token}"
        self.nodes = [f"g{self.token}n{i}" for i in range(1, nodes + 1)]
        self.cpus, self.mem_mb, self.kill_wait_s = cpus, mem_mb, kill_wait_s
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.conf = root / "etc" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        for var in [v for v in self.env if v.startswith(("SLURM_", "SBATCH_", "SRUN_"))]:
            if var != "SLURM_CONF":  # an outer Slurm job's settings must not leak in
                del self.env[var]

    # ---------------------------------------------------------------- start / stop

    def start(self) -> None:
        for d in ("etc", "munge", "state", "spool", "log"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self._start_munge()
        self._write_conf()
        self._spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(self.conf)])
        wait_for(lambda: self._ctl_up(), "slurmctld to answer", 60)
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        wait_for(self._all_idle, f"nodes {self.nodes} to be idle", 90)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "wb")  # noqa: SIM115 - closed by the child's end
        self.procs[name] = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)
        log.close()
        time.sleep(0.2)
        if self.procs[name].poll() is not None:
            raise RuntimeError(f"{name} exited at once with {self.procs[name].returncode}: "
                               f"{self.tail(self.root / 'log' / f'{name}.stdout')}")

    def _start_munge(self) -> None:
        mdir = self.root / "munge"
        mdir.chmod(0o711)
        key = mdir / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        self.munge_socket = mdir / "munge.sock"
        self._spawn("munged", ["munged", "-F", "--force", f"--key-file={key}",
                               f"--socket={self.munge_socket}", f"--pid-file={mdir / 'munged.pid'}",
                               f"--log-file={mdir / 'munged.log'}", f"--seed-file={mdir / 'seed'}"])
        wait_for(self.munge_socket.exists, "munged's socket", 20, every=0.1)

    def _write_conf(self) -> None:
        r = self.root
        host = socket.gethostname().split(".")[0]
        user = getpass.getuser()
        ctl_port, node_ports = free_port(), [free_port() for _ in self.nodes]
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctl_port}",
            f"SlurmdPort={node_ports[0]}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}/%n",
            f"SlurmctldPidFile={r / 'state' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'spool'}/slurmd-%n.pid",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/cgroup",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
            f"KillWait={self.kill_wait_s}",
            "MinJobAge=900",
            "InactiveLimit=0",
            "SlurmdTimeout=300",
        ]
        for node, port in zip(self.nodes, node_ports, strict=True):
            lines.append(f"NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                         f"CPUs={self.cpus} RealMemory={self.mem_mb} State=UNKNOWN")
        lines.append(f"PartitionName=main Nodes={','.join(self.nodes)} Default=YES "
                     "MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        # proctrack/cgroup reads cgroup.conf next to slurm.conf; nothing is constrained (the
        # nodes' CPUs and memory are declared, not real), only processes are tracked.
        (self.conf.parent / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nCgroupAutomount=no\n"
            "ConstrainCores=no\nConstrainRAMSpace=no\nConstrainDevices=no\n")

    def _ctl_up(self) -> bool:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.logs_tail()}")
        return self.run("scontrol", "ping", check=False).returncode == 0

    def _all_idle(self) -> bool:
        self._ctl_up()
        out = self.run("sinfo", "--noheader", "--Node", "--format=%N %t", check=False).stdout
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in self.nodes)

    def stop(self) -> None:
        """Cancel every job, wait for them to end (bounded), then stop the daemons: SIGTERM,
        then SIGKILL after 15 s, each by the pid this object started."""
        with contextlib.suppress(Exception):
            if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
                self.run("scancel", "--full", "--user", getpass.getuser(), check=False)
                wait_for(lambda: not self.jobs(), "every job to end", self.kill_wait_s + 60, 1.0)
        for name in reversed(list(self.procs)):
            p = self.procs[name]
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in reversed(list(self.procs.values())):
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        self._remove_cgroups()

    def _remove_cgroups(self) -> None:
        """The cgroup directories Slurm made for this cluster's nodes: empty once the jobs
        ended. A process still in one (a job that outlived the wait for it) was started by
        this cluster's jobs: it is killed by its pid, then the directories are removed."""
        tops = [t for node in self.nodes for t in Path("/sys/fs/cgroup").glob(f"*/slurm_{node}")]
        for top in tops:
            for procs in top.rglob("cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    for pid in procs.read_text().split():
                        print(f"[slurm] killing pid {pid} left in {procs.parent}", flush=True)
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(int(pid), signal.SIGKILL)
        for top in tops:
            for d in sorted((p for p in top.rglob("*") if p.is_dir()),
                            key=lambda p: len(p.parts), reverse=True) + [top]:
                for _ in range(20):  # a killed process leaves its cgroup within moments
                    try:
                        d.rmdir()
                        break
                    except OSError as exc:
                        last = exc
                        time.sleep(0.1)
                else:
                    print(f"[slurm] left {d}: {last}", flush=True)

    # ---------------------------------------------------------------- commands

    def run(self, *args: str, check: bool = True, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(list(args), env={**self.env, **(env or {})}, capture_output=True,
                           text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}): {r.stderr}{r.stdout}")
        return r

    def jobs(self) -> list[str]:
        out = self.run("squeue", "--noheader", "--format=%i", check=False).stdout
        return [j.strip() for j in out.splitlines() if j.strip()]

    def step_id(self, job: str, name: str) -> str:
        """The id (``job.step``) of the running step of ``job`` named ``name``."""
        out = self.run("squeue", "--steps", "--noheader", f"--jobs={job}",
                       "--format=%i %j").stdout
        ids = [i for i, n in (line.split() for line in out.splitlines() if line.strip())
               if n == name]
        if len(ids) != 1:
            raise RuntimeError(f"job {job}: steps named {name}: {ids} ({out!r})")
        return ids[0]

    def job_field(self, job: str, field: str) -> str | None:
        """A field of ``scontrol show job`` (JobState, ExitCode, NodeList, ...)."""
        out = self.run("scontrol", "--oneliner", "show", "job", job, check=False).stdout
        for tok in out.split():
            if tok.startswith(f"{field}="):
                return tok.split("=", 1)[1]
        return None

    def wait_job_end(self, job: str, timeout: float) -> str:
        """Wait until ``job`` has left the queue; returns its final JobState."""
        wait_for(lambda: job not in self.jobs(), f"job {job} to end", timeout, 1.0)
        return self.job_field(job, "JobState") or "?"

    @staticmethod
    def tail(path: Path, chars: int = 3000) -> str:
        try:
            return path.read_text(errors="replace")[-chars:]
        except OSError as exc:
            return f"({exc})"

    def logs_tail(self, chars: int = 2000) -> str:
        return "\n".join(f"--- {p}\n{self.tail(p, chars)}"
                         for p in sorted((self.root / "log").glob("*")) if p.is_file())
