"""How the comparison benchmark names the processes of a runner's tree in its memory breakdown
(benchmarks/compare/process_tree.py), on real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
from benchmarks.compare.process_tree import ProcessTreeSampler, describe_command, process_label

FORKING = """
import os, sys, time
if os.fork() == 0:
    time.sleep(30)
    os._exit(0)
sys.stdout.write("forked\\n")
sys.stdout.flush()
time.sleep(30)
"""


def test_programs_are_named_by_their_main_class_or_module() -> None:
    java = ["/usr/bin/java", "-cp", "a.jar:b.jar", "-Xmx1g", "org.apache.spark.deploy.SparkSubmit", "x"]
    assert describe_command(java) == "JVM SparkSubmit"
    daemon = [
        "/venv/bin/python",
        "/venv/bin/sparkafka-python",
        "-m",
        "pyspark.daemon",
        "pyspark.sql.worker.create_data_source",
    ]
    assert describe_command(daemon) == "python -m pyspark.daemon [create_data_source]"
    # sparkafka-python once it waits for the zygote's child as a shell (runner_zygote._wait_in_shell).
    waiter = [
        "/bin/sh",
        "-c",
        "read ...",
        "sparkafka-python-waiter",
        "pyspark.daemon",
        "a.b.create_data_source",
    ]
    assert describe_command(waiter) == "python -m pyspark.daemon [create_data_source], waiting as sh"
    zygote = ["/venv/bin/python", "-m", "sparkafka.runtime.runner_zygote", "/tmp/z/zygote.sock", "12"]
    assert describe_command(zygote) == "python -m sparkafka.runtime.runner_zygote"


def test_a_fork_is_named_after_its_parent_and_the_peak_sample_keeps_every_process(tmp_path: Path) -> None:
    script = tmp_path / "forking.py"
    script.write_text(FORKING)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "forked\n"
        root = psutil.Process(parent.pid)
        tree = [root, *root.children(recursive=True)]
        assert len(tree) == 2
        assert process_label(tree[0], tree) == "python forking.py"
        assert process_label(tree[1], tree) == "fork of python forking.py"

        sampler = ProcessTreeSampler(parent.pid, interval_s=0.05).start()
        time.sleep(0.3)
        sampler.stop()
        summary = {group["process"]: group for group in sampler.peak_by_label()}
        assert set(summary) == {"python forking.py", "fork of python forking.py"}
        assert all(group["count"] == 1 and group["rss_mib"] > 0 for group in summary.values())
        assert sum(group["rss_mib"] for group in summary.values()) <= sampler.peak_rss_bytes / 2**20 + 0.2
    finally:
        for process in psutil.Process(parent.pid).children(recursive=True):
            process.kill()
        parent.kill()
        parent.wait()


def test_a_zygote_child_is_named_after_its_launcher_also_when_the_launcher_waits_as_a_shell(
    tmp_path: Path,
) -> None:
    """The launcher and the zygote's child read one pipe (the child's standard input), whose write
    end the JVM holds (here: this process, listed first). A launcher waiting as a shell holds that
    pipe elsewhere than at 0 while it reads (the shell moves its standard input aside)."""
    read_end, write_end = os.pipe()
    fifo = tmp_path / "exit-line"
    os.mkfifo(fifo)
    # Open for writing too, so that the shell's open does not block: it then moves its standard
    # input aside and waits in the read.
    keep_open = os.open(fifo, os.O_RDWR)
    # A stand-in for sparkafka's zygote (its module name on the command line): its fork has the
    # same command line.
    zygote = subprocess.Popen(
        [sys.executable, "-c", FORKING, "sparkafka.runtime.runner_zygote"],
        stdin=read_end,
        stdout=subprocess.PIPE,
        text=True,
    )
    waiter = subprocess.Popen(
        ["/bin/sh", "-c", 'read -r line < "$1"', "sparkafka-python-waiter", str(fifo)], stdin=read_end
    )
    os.close(read_end)
    try:
        assert zygote.stdout is not None and zygote.stdout.readline() == "forked\n"
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{waiter.pid}/fd/0") != str(fifo) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert os.readlink(f"/proc/{waiter.pid}/fd/0") == str(fifo), "the shell is in its read"
        child = psutil.Process(zygote.pid).children()[0]
        tree = [psutil.Process(os.getpid()), psutil.Process(waiter.pid), psutil.Process(zygote.pid), child]
        assert process_label(child, tree) == f"python -m {fifo} (zygote fork)"
        assert process_label(tree[1], tree) == f"python -m {fifo}, waiting as sh"
    finally:
        os.close(keep_open)
        os.close(write_end)
        for process in psutil.Process(zygote.pid).children(recursive=True):
            process.kill()
        for started in (zygote, waiter):
            started.kill()
            started.wait()
