"""Spark beyond `local[*]`, from the pyspark package alone: a standalone cluster (master and one
worker, started with `spark-class`) and a Spark Connect server (`start-connect-server.sh
--wait`), each on loopback and stopped with everything it started."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyspark

from adapter.localstack.synapse import free_port

SPARK_HOME = Path(pyspark.__file__).parent


def spark_env(work: Path) -> dict[str, str]:
    """Spark's scripts with this venv's Python, logs and pids under `work`, on loopback."""
    work.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "SPARK_HOME": str(SPARK_HOME),
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_PID_DIR": str(work / "pids"),
        "SPARK_WORKER_DIR": str(work / "worker"),
    }


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"exited with {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.3)
    raise TimeoutError(f"nothing listens on {port} after {timeout} s: {log.read_text()[-2000:]}")


def _start(command: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def _wait_for_worker(master_log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "Registering worker" in master_log.read_text(errors="replace"):
            return
        time.sleep(0.3)
    raise TimeoutError(f"no worker registered: {master_log.read_text()[-2000:]}")


@contextlib.contextmanager
def standalone_cluster(work: Path, cores: int = 1, memory: str = "1g") -> Iterator[str]:
    """A master and one worker; yields the master URL (spark://127.0.0.1:<port>)."""
    env = spark_env(work)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = free_port()
    master_log = work / "master.log"
    master = _start(
        [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())),
        ],
        env,
        master_log,
    )
    worker: subprocess.Popen[bytes] | None = None
    try:
        _wait_for_port(port, master, master_log, 60)
        url = f"spark://127.0.0.1:{port}"
        worker = _start(
            [
                spark_class,
                "org.apache.spark.deploy.worker.Worker",
                url,
                *("--host", "127.0.0.1", "--cores", str(cores), "--memory", memory),
                *("--webui-port", str(free_port())),
            ],
            env,
            work / "worker.log",
        )
        _wait_for_worker(master_log, 60)
        yield url
    finally:
        if worker is not None:
            _stop(worker)
        _stop(master)


@contextlib.contextmanager
def connect_server(work: Path, master: str = "local[1]", memory: str = "1g") -> Iterator[str]:
    """A Spark Connect server (its driver on `master`); yields its sc:// URL."""
    env = spark_env(work)
    port = free_port()
    log = work / "connect.log"
    server = _start(
        [
            str(SPARK_HOME / "sbin" / "start-connect-server.sh"),
            "--wait",
            *("--master", master, "--driver-memory", memory),
            *("--conf", f"spark.connect.grpc.binding.port={port}"),
            *("--conf", "spark.connect.grpc.binding.address=127.0.0.1"),
            *("--conf", "spark.ui.enabled=false"),
        ],
        env,
        log,
    )
    try:
        _wait_for_port(port, server, log, 90)
        yield f"sc://127.0.0.1:{port}"
    finally:
        _stop(server)
