#!/bin/bash
reward=1
command -v shipit >/dev/null || { echo "shipit is not on PATH"; reward=0; }
command -v ls >/dev/null || { echo "the system tools fell off PATH"; reward=0; }
[ "$(cat /app/invalid.txt 2>/dev/null)" = $'cron.conf\nworker.conf' ] || { echo "invalid.txt is wrong"; reward=0; }
echo $reward > /logs/verifier/reward.txt
