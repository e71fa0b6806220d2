#!/bin/bash
set -euo pipefail

mkdir -p inbox
chown ubuntu:ubuntu inbox
chmod 750 inbox
jq -n --arg owner ubuntu --argjson uid "$(id -u ubuntu)" --arg inbox "$PWD/inbox" \
  '{owner: $owner, uid: $uid, inbox: $inbox}' > manifest.json
cat manifest.json
