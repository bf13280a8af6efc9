"""The test harness's own promise for multi-process tests (tests/train_testlib.py `reap`): when
one process fails, the peer it leaves waiting shows where it waits and does not hold the suite.

A hang between two training processes ends in one traceback (the process whose collective
timed out); without its peer's stacks the other half of the hang is a guess.
"""

import signal
import subprocess
import sys
import textwrap
import time

import train_testlib as tl

WAITING_PEER = textwrap.dedent("""
    import faulthandler, signal, time
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    def waiting_for_the_failed_peer():
      print("waiting", flush=True)
      while True:
        time.sleep(0.05)

    waiting_for_the_failed_peer()
""")


def test_a_failed_processs_waiting_peer_prints_its_stacks_and_is_killed(tmp_path, monkeypatch):
  monkeypatch.setattr(tl, "PEERS_END_S", 2.0)
  logs = [open(tmp_path / f"log{i}.txt", "w") for i in (0, 1)]
  peer = subprocess.Popen([sys.executable, "-c", WAITING_PEER], stdout=logs[1],
                          stderr=subprocess.STDOUT)
  tl.wait_until(lambda: "waiting" in (tmp_path / "log1.txt").read_text(), [peer],
                "the waiting peer")  # Its handler is registered.
  failed = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], stdout=logs[0],
                            stderr=subprocess.STDOUT)
  start = time.monotonic()
  texts = tl.reap([(failed, logs[0]), (peer, logs[1])], "the pair", stacks_signal=signal.SIGUSR1)
  assert failed.returncode == 3
  assert peer.returncode == -signal.SIGKILL  # It would have waited forever.
  assert "in waiting_for_the_failed_peer" in texts[1]  # faulthandler's stack of its thread.
  assert time.monotonic() - start < tl.IDLE_S  # Not the idle watchdog: the failure ended it.
