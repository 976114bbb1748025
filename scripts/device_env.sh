# Source on the device machine (no network): install the carried wheels (.whl, see ../shared/device/wheels.sh)
# and put the checkout's src/ and the wheels' commands (pyminify, which the record script runs) on the paths.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || return 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:$PATH
