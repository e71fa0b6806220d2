#!/bin/bash
# Reference solution: runs as the image's USER (agent), in its WORKDIR (/home/agent).
set -euo pipefail
id -un > whoami.txt
echo "solved as $(id -un)" > /logs/agent/solved-by.txt
