# Source on the device machine (no network): install the carried wheels (.whl, see ../shared/device/wheels.sh)
# and put the checkout's src/ on the path.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || return 1
export PYTHONPATH=$PWD/src:/tmp/site PYTHONUNBUFFERED=1
