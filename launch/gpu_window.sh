#!/bin/bash
# One GPU window of measurements, as one command: `launch/gpu_window.py` after installing, from
# carried wheels, the packages the bare GPU image lacks. Writes into $OUT (the device tool
# returns it): gpu_window.jsonl (one JSON line per result, written as each is measured) and
# gpu_window.log. Budget: 8 minutes in all, the install (~15 s) and 460 s of stages.
#
#   # here, once (as launch/device_window.sh): the wheels the GPU image lacks
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl ml-collections==1.1.0 clu==0.0.12
#   # there (carry .whl); the commit is written here, where git is:
#   bash launch/gpu_window.sh --commit=<sha>
#   # here, on the CPU, the same sequence at tiny sizes (what tests/launch/test_gpu_window.py runs):
#   python -m launch.gpu_window --dry_run --out=/tmp/gpu_window_dry
# Further arguments go to launch/gpu_window.py (--deadline_s, --stages, --commit).
set -u
out=${OUT:-/tmp/gpu_window_out}
ls .whl/*.whl > /dev/null 2>&1 || { echo ".whl/ holds no wheels; allowed: carry .whl (see the header)"; exit 2; }
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
python3 -m launch.gpu_window --out="$out" "$@"
status=$?
ls -la "$out"
exit $status
