#!/bin/bash
cd /var/log/app
reward=1
want=$'app-01d.log.gz\napp-02d.log.gz\napp-03d.log.gz\napp.log'
got=$(ls -1 | sort)
[ "$got" = "$want" ] || { echo "files left:"; echo "$got"; reward=0; }
[ "$(cat app.log 2>/dev/null)" = "current" ] || { echo "app.log changed"; reward=0; }
[ "$(zcat app-03d.log.gz 2>/dev/null)" = "log line from 3 days ago" ] || { echo "app-03d.log.gz is not the compressed log"; reward=0; }
[ -f /var/log/unrelated.log ] || { echo "a file outside /var/log/app was removed"; reward=0; }
echo $reward > /logs/verifier/reward.txt
