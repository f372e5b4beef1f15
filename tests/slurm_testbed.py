"""A one-node Slurm cluster on loopback, started and stopped by the tests themselves.

``SlurmCluster`` writes its own munge key, ``slurm.conf`` and ``cgroup.conf`` into a temporary
directory, starts ``munged`` (its own socket, key, pid and log files), ``slurmctld`` and
``slurmd`` in the foreground on free loopback ports, and points ``SLURM_CONF`` at its config
for the Slurm commands the pool runs. Nothing is written to ``/etc``; on exit every job is
cancelled and each daemon is stopped by its pid (SIGTERM, then SIGKILL). Jobs run as root
(``SlurmUser=root``); process tracking is ``proctrack/linuxproc``, so no cgroup plugin is used.
``SLURM_PROBLEM`` says why the machine cannot run it (``None`` when it can).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tests.flat_settings import split_off
from tests.processes import free_port
from trajcore.adapters.pools.slurm_pool import SlurmPoolConfig
from trajcore.domain.isolation import SlotIsolation
from trajcore.domain.slurm_jobs import SlurmJobSettings

NODE = "trajnode"
KILL_WAIT_S = 2  # the cluster's KillWait: SIGKILL this long after a job's SIGTERM
SLOT_SERVER = (sys.executable, "-m", "trajcore.entrypoints.slot_server")
_DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol")


def _problem() -> str | None:
    missing = [name for name in _DAEMONS if shutil.which(name) is None]
    if missing:
        return f"Slurm and munge are not installed ({', '.join(missing)} missing; apt-get " \
            "install slurmctld slurmd slurm-client munge)"  # fmt: skip
    if os.geteuid() != 0:
        return "the test cluster runs its daemons and jobs as root (SlurmUser=root)"
    return None


SLURM_PROBLEM = _problem()


class SlurmCluster:
    """``with SlurmCluster() as cluster``: munged, slurmctld and slurmd running (see module)."""

    def __init__(self, *, cpus: int = 16, memory_mb: int = 16000) -> None:
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.dir = Path(tempfile.mkdtemp(prefix="trajcore-slurm-"))
        self.conf = self.dir / "slurm.conf"
        self._processes: list[subprocess.Popen[bytes]] = []
        self._saved_conf: str | None = None

    # ------------------------------------------------------------------------- lifetime

    def __enter__(self) -> SlurmCluster:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _start(self) -> None:
        d = self.dir
        for sub in ("state", "spool", "log", "shared"):
            (d / sub).mkdir()
        key = d / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, timeout=30)
        self._spawn(
            "munged",
            ["munged", "--foreground", "--force", f"--socket={d / 'munge.sock'}",
             f"--key-file={key}", f"--pid-file={d / 'munged.pid'}",
             f"--log-file={d / 'log' / 'munged.log'}", f"--seed-file={d / 'munge.seed'}"],
        )  # fmt: skip
        self._wait_for((d / "munge.sock").exists, "munged's socket")
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(self._slurm_conf(host), encoding="utf-8")
        (d / "cgroup.conf").write_text("CgroupPlugin=autodetect\n", encoding="utf-8")
        self._saved_conf = os.environ.get("SLURM_CONF")
        os.environ["SLURM_CONF"] = str(self.conf)
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self._spawn("slurmd", ["slurmd", "-D", "-N", NODE])
        self._wait_for(lambda: self.node_state() == "idle", "the node to be idle")

    def _slurm_conf(self, host: str) -> str:
        d = self.dir
        return f"""\
ClusterName=trajcore-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d / "munge.sock"}
CredType=cred/munge
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd.pid"}
SlurmctldLogFile={d / "log" / "slurmctld.log"}
SlurmdLogFile={d / "log" / "slurmd.log"}
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
KillWait={KILL_WAIT_S}
MinJobAge=120
InactiveLimit=0
SlurmctldTimeout=10
SlurmdTimeout=10
NodeName={NODE} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus} \
RealMemory={self.memory_mb} State=UNKNOWN
PartitionName=debug Nodes={NODE} Default=YES MaxTime=INFINITE State=UP
"""

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = (self.dir / "log" / f"{name}.out").open("wb")
        with log:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "SLURM_CONF": str(self.conf)}, start_new_session=True,
            )  # fmt: skip
        self._processes.append(process)

    def _wait_for(self, ready: object, what: str, timeout_s: float = 30.0) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for process in self._processes:
                if process.poll() is not None:
                    raise RuntimeError(
                        f"{process.args!r} exited with {process.returncode} while waiting "
                        f"for {what}: {self.logs()}"
                    )
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"timed out waiting for {what}: {self.logs()}")

    def stop(self) -> None:
        """Cancel every job, then stop each daemon by its pid; idempotent."""
        if any(p.poll() is None for p in self._processes):
            self.run("scancel", "--me", check=False)
            deadline = time.monotonic() + 15
            while (
                time.monotonic() < deadline
                and self.run(
                    "squeue",
                    "--me",
                    "--noheader",
                    "--states=PENDING,RUNNING,COMPLETING",
                    check=False,
                ).strip()
            ):
                time.sleep(0.2)
        for process in reversed(self._processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        self._processes.clear()
        if self._saved_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = self._saved_conf
        shutil.rmtree(self.dir, ignore_errors=True)

    # ------------------------------------------------------------------------- commands

    def run(self, *argv: str, check: bool = True) -> str:
        """A Slurm command against this cluster; its output."""
        done = subprocess.run(
            list(argv), capture_output=True, check=False, timeout=30,
            env={**os.environ, "SLURM_CONF": str(self.conf)},
        )  # fmt: skip
        if check and done.returncode != 0:
            raise RuntimeError(f"{argv}: {done.stderr.decode(errors='replace')}")
        return done.stdout.decode(errors="replace")

    def node_state(self) -> str:
        return self.run("sinfo", "--noheader", "--format=%T", check=False).strip()

    def job_state(self, job_id: str) -> str:
        return self.run("squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%T",
                        check=False).strip()  # fmt: skip

    def logs(self) -> str:
        tails = []
        for path in sorted((self.dir / "log").glob("*")):
            text = path.read_text(errors="replace").strip().splitlines()[-5:]
            tails.append(f"{path.name}: " + " | ".join(text))
        return "; ".join(tails)

    # ------------------------------------------------------------------------- pools

    def pool_config(
        self,
        *,
        containers: int = 1,
        slots_per_container: int = 1,
        acquire_timeout_s: float | None = 30.0,
        **overrides: object,
    ) -> SlurmPoolConfig:
        """A pool of the real slot server on this cluster, tuned for fast tests."""
        settings: dict[str, object] = {
            "job_name": "trajcore-test",
            "command": SLOT_SERVER,
            "slots_per_container": slots_per_container,
            "min_containers": containers,
            "max_containers": containers,
            "acquire_timeout_s": acquire_timeout_s,
            "shared_dir": self.dir / "shared",
            "memory_mb": 256,
            "time_limit_min": 30,
            "drain_before_s": 0.0,
            "bind_host": "127.0.0.1",
            "isolation": SlotIsolation(
                require_sandbox=shutil.which("bwrap") is not None,
                min_timeout_s=0.2,
                max_processes=64,
                memory_bytes=512 << 20,
            ),
            "start_timeout_s": 60.0,
            "reset_timeout_s": 10.0,
            "poll_interval_s": 0.2,
            "cooldown_s": 0.0,
            "stop_timeout_s": 20.0,
        }
        settings.update(overrides)
        pool = dict(settings)
        defaults = SlurmPoolConfig()
        job = split_off(SlurmJobSettings(), pool)
        server, scaling = split_off(defaults.server, pool), split_off(defaults.scaling, pool)
        return SlurmPoolConfig(
            job=job,
            server=server,
            scaling=scaling,
            **pool,  # type: ignore[arg-type]
        )
