"""A `gs://` workdir end to end, against a GCS emulator on 127.0.0.1 (gcp-storage-emulator,
with the download header tensorstore needs added by `gcs_emulator.py`).

Each component is pointed at the emulator the way it is pointed at a real endpoint:
  etils.epath (config, summary, ceilings, probe outputs, collect's reads, the TensorBoard
    events): fsspec's gcsfs, through STORAGE_EMULATOR_HOST;
  Orbax (checkpoint metadata through epath, arrays through tensorstore's GCS driver):
    TENSORSTORE_GCS_HTTP_URL, with GOOGLE_AUTH_TOKEN_FOR_TESTING instead of credentials;
  tensorboard's reader (`curves.read_scalars`): its fsspec file system, i.e. gcsfs again.
A smoke run is stopped half way (`stop_after_steps`), resumed to the end in a second
process, and must end with exactly the parameters of an uninterrupted local run; it is then
restored, probed (outputs into the bucket) and collected.
"""

import json
import os
import socket
import subprocess
import sys
import threading

import chex
from etils import epath
import fsspec
import pytest

from hypernet_attention.runs import config_checks
from hypernet_attention.runs import lock
from hypernet_attention.runs import run_files
from hypernet_attention.train import build
from hypernet_attention.train import checkpointing
from hypernet_attention.train import loop

import train_testlib as tl

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).

HERE = os.path.dirname(os.path.abspath(__file__))  # gcs_emulator.py
TRAIN = """
import json
import sys
sys.path.insert(0, TESTS)
import train_testlib as tl
from hypernet_attention.train import build
from hypernet_attention.train import checkpointing
from hypernet_attention.train import loop
updates = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
loop.train_and_evaluate(tl.smoke("sraven", **updates), sys.argv[1])
""".replace("TESTS", repr(tl.TESTS))


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
  """The emulator (bucket `bucket`, in memory) and the environment that points at it."""
  port = _free_port()
  log = tmp_path_factory.mktemp("gcs") / "emulator.log"
  with open(log, "w") as out:  # gcs_emulator.py: the emulator plus one header, see there.
    process = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "gcs_emulator.py"), "start", "--host=127.0.0.1",
         f"--port={port}", "--in-memory", "--default-bucket=bucket"], stdout=out,
        stderr=subprocess.STDOUT)
  def listening():
    assert process.poll() is None, log.read_text()
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1).close()
      return True
    except OSError:
      return False

  tl.wait_until(listening, [process], f"the GCS emulator to listen on port {port}", [log],
                poll_s=0.2)
  url = f"http://127.0.0.1:{port}"
  env = dict(STORAGE_EMULATOR_HOST=url, TENSORSTORE_GCS_HTTP_URL=url,
             GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator", EPATH_USE_TF="false",
             GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false")  # No gRPC probe of the bucket.
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    yield env
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = v
    process.kill()
    process.wait()


def _run(args):
  proc = tl.run([sys.executable, *args], env=tl.subprocess_env(), capture_output=True,
                text=True, cwd=tl.REPO)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


def test_paths_stay_bucket_paths_and_local_ones_expand(monkeypatch, tmp_path):
  # No emulator here: an anonymous token skips the credentials check (test_bad_input.py).
  monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
  assert str(run_files.path("gs://b/run")) == "gs://b/run"
  monkeypatch.setenv("HOME", str(tmp_path))
  assert str(run_files.path("~/run")) == str(tmp_path / "run")
  monkeypatch.chdir(tmp_path)
  assert str(run_files.path("run")) == str(tmp_path / "run")


def test_json_round_trip_in_the_bucket(gcs):
  del gcs
  p = run_files.path("gs://bucket/json_test") / "x.json"
  assert run_files.read_json(p) is None
  run_files.write_json(p, {"a": [1, 2]})
  run_files.write_json(p, {"a": [3]})  # Overwrites.
  assert run_files.read_json(p) == {"a": [3]}
  assert [q.name for q in p.parent.iterdir()] == ["x.json"]  # No temporary file left.


@pytest.mark.slow
def test_train_stop_resume_restore_probe_collect_in_a_bucket(gcs, tmp_path):
  del gcs
  from hypernet_attention.runs import curves  # pylint: disable=g-import-not-at-top
  from hypernet_attention.train import restore  # pylint: disable=g-import-not-at-top
  from launch import collect  # pylint: disable=g-import-not-at-top
  workdir = "gs://bucket/sweep/sraven_hyla"
  _run(["-c", TRAIN, workdir, json.dumps({"stop_after_steps": 4})])
  root = run_files.path(workdir)
  assert run_files.read_config(workdir)["experiment"] == "sraven"
  assert not (root / run_files.SUMMARY).exists()  # Stopped half way.
  assert sorted(p.name for p in (root / run_files.CHECKPOINTS).iterdir()
                if p.name.isdigit()) == ["4"]
  _run(["-c", TRAIN, workdir])  # Resumes from step 4.
  summary = run_files.read_summary(workdir)
  assert summary["step"] == 8
  assert (root / run_files.CEILINGS).exists()
  assert not list(root.glob("*.tmp"))

  local = str(tmp_path / "local")
  expected = loop.train_and_evaluate(tl.smoke("sraven"), local)
  assert summary["test/accuracy"] == expected["test/accuracy"]
  run = restore.restore_params(workdir)
  assert run.step == 8
  chex.assert_trees_all_equal(run.params, restore.restore_params(local).params)
  steps, losses = curves.read_scalars(workdir, ["train/loss"])["train/loss"]
  assert steps.tolist() == [4, 8] and losses[-1] == pytest.approx(summary["train/loss"])

  probe = _run([os.path.join("experiments", "probe_latents.py"), f"--workdir={workdir}",
                "--num_problems=64", "--permutations=2"])
  assert probe.stdout.strip()
  metrics = run_files.read_json(root / "probe" / "metrics.json")
  assert metrics, (list(root.glob("*")), list(root.glob("*/*")), probe.stdout, probe.stderr[-2000:])
  assert metrics["step"] == 8
  assert (root / "probe" / "codes_8.npz").exists() and (root / "probe" / "embeddings.png").exists()

  [loaded] = collect.load_runs("gs://bucket/sweep")
  assert loaded.workdir == workdir and loaded.summary == summary
  out = tmp_path / "table"
  table = _run([os.path.join("launch", "collect.py"), "--root=gs://bucket/sweep",
                f"--out={out}"])
  assert "1 finished runs under gs://bucket/sweep" in table.stdout
  assert (out / "table_a1.md").exists()

  # A corrupt newest step in the bucket is moved aside and the previous one restored.
  for f in _files(root / run_files.CHECKPOINTS / "8" / "state"):
    f.write_bytes(b"garbage")
  ckpt = checkpointing.Checkpointer(workdir)
  try:
    checked = config_checks.validate(tl.smoke("sraven"))
    state = ckpt.restore_latest(build.setup(checked).restore_target())
  finally:
    ckpt.close()
  assert int(state.step) == 4
  assert ckpt.all_steps() == [4]
  moved = sorted(p.name for p in (root / run_files.CORRUPT_CHECKPOINTS).iterdir())
  assert len(moved) == 2 and moved[0].startswith("8-") and moved[1] == moved[0] + ".txt"


def _files(directory):
  """Every file below `directory` (a bucket has no recursive glob)."""
  for p in directory.iterdir():
    yield from _files(p) if p.is_dir() else [p]


# Long enough that the kill after step 8's checkpoint lands mid-run: each save to the
# emulator takes seconds, and seven more follow it.
LONG = {"num_train_steps": 64, "eval_every_steps": 64, "log_every_steps": 64,
        "checkpoint_every_steps": 8, "eval.ceiling_problems": 0}


@pytest.mark.slow
def test_sigkilled_run_resumes_in_the_bucket_past_its_stale_lock(gcs, tmp_path):
  """SIGKILL mid-run (no handler runs: the lock and maybe a half-written step stay in the
  bucket); the rerun takes the dead process's lock over and ends bit-identical to an
  uninterrupted local run."""
  del gcs
  from hypernet_attention.train import restore  # pylint: disable=g-import-not-at-top
  workdir = "gs://bucket/killed/sraven_hyla"
  root = run_files.path(workdir)
  trainer = subprocess.Popen([sys.executable, "-c", TRAIN, workdir, json.dumps(LONG)],
                             env=tl.subprocess_env(),
                             cwd=tl.REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  def saved():
    assert trainer.poll() is None, trainer.stderr.read()[-3000:]
    return (root / run_files.CHECKPOINTS / "8").exists()

  tl.wait_until(saved, [trainer], "a checkpoint at step 8 in the bucket", poll_s=0.2)
  trainer.kill()
  trainer.wait()
  assert (root / "lock.json").exists()  # Left behind by the killed process.
  _run(["-c", TRAIN, workdir, json.dumps(LONG)])  # Resumes past the stale lock.
  assert run_files.read_summary(workdir)["step"] == LONG["num_train_steps"]
  assert not (root / "lock.json").exists()
  local = str(tmp_path / "local")
  loop.train_and_evaluate(tl.smoke("sraven", **LONG), local)
  chex.assert_trees_all_equal(restore.restore_params(workdir).params,
                              restore.restore_params(local).params)


def test_collect_writes_its_tables_to_the_bucket(gcs, tmp_path):
  """A gs:// root's tables go to the bucket (before: a local `./gs:/...` folder)."""
  del gcs
  run = run_files.path("gs://bucket/tables/fuzzy_hyla")
  run.mkdir(parents=True, exist_ok=True)
  run_files.write_json(run / "config.json", {
      "experiment": "fuzzy_logic", "seed": 0, "model": {"attention": "hyla"}})
  run_files.write_json(run / "summary.json", {"ood/r2": 0.5, "test/r2": 0.6,
                                                "wall_time_s": 1.0})
  proc = tl.run([sys.executable, os.path.join(tl.REPO, "launch", "collect.py"),
                 "--root=gs://bucket/tables"], env=tl.subprocess_env(),
                capture_output=True, text=True, cwd=tmp_path)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = run_files.path("gs://bucket/tables")
  assert "1 finished runs under gs://bucket/tables" in (out / "table_a1.md").read_text()
  assert (out / "table_a1.csv").exists() and (out / "table_a1.png").read_bytes()[:4] == \
      b"\x89PNG"
  assert os.listdir(tmp_path) == []


def _contenders(gcs, name: str) -> tuple[str, list[str]]:
  """A free lock path in the bucket and two writers' records for it."""
  del gcs
  path = f"gs://bucket/race/{name}/{lock.LOCK_FILE}"
  return path, [json.dumps(dict(token=f"writer{i}")) for i in range(2)]


def test_a_writer_whose_check_is_stale_loses_the_gs_lock(gcs, monkeypatch):
  """Two writers both saw no lock file (the second looked before the first's object
  landed): only the storage's atomic create can refuse the second; a check, write and
  read-back lets both win (the second reads back its own token)."""
  path, (first, second) = _contenders(gcs, "stale_check")
  assert lock._create_exclusive(epath.Path(path), first)
  # What it saw before (the class epath builds for gs://, where `exists` is defined):
  monkeypatch.setattr(type(epath.Path(path)), "exists", lambda self: False)
  assert not lock._create_exclusive(epath.Path(path), second)
  monkeypatch.undo()
  assert json.loads(epath.Path(path).read_text())["token"] == "writer0"


def _race(path: str, texts: list[str], order: tuple[int, int]) -> dict[int, bool]:
  """Writer i creates `path` holding `texts[i]`, both released at once; who won."""
  go, won = threading.Barrier(2), {}

  def write(i):
    go.wait()
    won[i] = lock._create_exclusive(epath.Path(path), texts[i])

  threads = [threading.Thread(target=write, args=(i,)) for i in order]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  return won


def test_exactly_one_of_two_racing_writers_takes_the_gs_lock(gcs):
  """Two threads create the same free lock at once, 20 times, each order of start as
  often: exactly one wins each time, and the file holds the winner's record."""
  for trial in range(20):
    path, texts = _contenders(gcs, f"race{trial}")
    won = _race(path, texts, (0, 1) if trial % 2 else (1, 0))
    assert sorted(won.values()) == [False, True], (trial, won)
    winner = next(i for i, w in won.items() if w)
    assert epath.Path(path).read_text() == texts[winner], trial
