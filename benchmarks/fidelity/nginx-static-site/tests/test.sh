#!/bin/bash

fail() {
  echo "FAIL: $*"
  echo 0 > /logs/verifier/reward.txt
  exit 0
}

body=$(curl -fsS --max-time 5 http://localhost:8080/) || fail "nothing answers on :8080"
[ "$body" = "<h1>Harbor status: green</h1>" ] || fail "unexpected index: $body"

health=$(curl -fsS --max-time 5 http://localhost:8080/health) || fail "no /health"
[ "$health" = "ok" ] || fail "unexpected health: $health"

if curl -fsS --max-time 2 http://localhost:80/ >/dev/null 2>&1; then
  fail "port 80 still serves something"
fi

pgrep -x nginx >/dev/null || fail "nginx is not running"

echo PASS
echo 1 > /logs/verifier/reward.txt
