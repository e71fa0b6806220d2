#!/bin/bash
set -u
mkdir -p /app/wheels
pip3 download --quiet --no-deps --only-binary=:all: --dest /app/wheels six==1.16.0
curl --silent --show-error --max-time 30 --output /dev/null https://deb.debian.org/debian/
echo $? > /app/other-host-exit.txt
