#!/bin/bash
reward=1
grep -q "releases.corp.internal" /etc/hosts || { echo "the ENTRYPOINT's hosts entry is missing"; reward=0; }
curl -fsS --max-time 5 http://releases.corp.internal:8080/index.json >/dev/null || { echo "the mirror is not being served"; reward=0; }
[ "$(cat /opt/ledger/VERSION 2>/dev/null)" = "1.10.2" ] || { echo "/opt/ledger/VERSION is not 1.10.2"; reward=0; }
[ "$(cat /app/installed.txt 2>/dev/null)" = "1.10.2" ] || { echo "/app/installed.txt is not 1.10.2"; reward=0; }
echo $reward > /logs/verifier/reward.txt
