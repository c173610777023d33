#!/bin/sh
# The python_client_install fixture: a venv in the build tree with the opserve package installed
# the way the README says (python3 -m venv --system-site-packages, then pip install
# --no-build-isolation --no-index), offline, over Debian's grpcio, protobuf and numpy.
#
# pip builds in the package's own directory, leaving build/ and opserve.egg-info/ next to
# setup.py; a copy in the build tree keeps the source tree untouched by tests.
# Usage: install_client.sh PYTHON3 PACKAGE_DIR PROTO_ROOT WORK_DIR
set -eu
python3=$1 package=$2 proto_root=$3 work=$4

rm -rf "$work/venv" "$work/package"
mkdir -p "$work"
cp -r "$package" "$work/package"
rm -rf "$work/package/build" "$work/package"/*.egg-info  # leftovers of an in-tree install
"$python3" -m venv --system-site-packages "$work/venv"
OPSERVE_PROTO_ROOT=$proto_root "$work/venv/bin/python" -m pip install --quiet --no-build-isolation \
  --no-index --disable-pip-version-check "$work/package"
"$work/venv/bin/python" -c 'import opserve; print("installed", opserve.__file__)'
