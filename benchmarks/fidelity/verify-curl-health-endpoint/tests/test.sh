#!/bin/bash
apt-get update > /dev/null
apt-get install -y --no-install-recommends curl > /dev/null

reward=1
[ "$(curl -s --max-time 5 http://localhost:9000/healthz)" = "ok" ] || { echo "/healthz"; reward=0; }
body=$(curl -s --max-time 5 "http://localhost:9000/sum?a=40&b=2")
[ "$(echo "$body" | tr -d ' ')" = '{"sum":42}' ] || { echo "/sum: $body"; reward=0; }
code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://localhost:9000/nope)
[ "$code" = "404" ] || { echo "/nope answered $code"; reward=0; }
echo $reward > /logs/verifier/reward.txt
