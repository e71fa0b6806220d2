#!/bin/bash
reward=1
make -C /app/src clean >/dev/null 2>&1
make -C /app/src >/dev/null || { echo "make fails"; reward=0; }
[ -x /usr/local/bin/wc-lite ] || { echo "wc-lite is not installed"; reward=0; }
got=$(printf 'alpha beta\n  gamma\n\ndelta' | /usr/local/bin/wc-lite 2>/dev/null)
[ "$got" = "3 4 25" ] || { echo "wc-lite printed '$got', want '3 4 25'"; reward=0; }
echo $reward > /logs/verifier/reward.txt
