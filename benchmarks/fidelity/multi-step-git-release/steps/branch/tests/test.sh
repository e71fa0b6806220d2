#!/bin/bash
cd /work/calc || exit 0
reward=1
git rev-parse --verify -q feature/subtract >/dev/null || { echo "no branch feature/subtract"; reward=0; }
[ "$(git rev-parse --abbrev-ref HEAD)" = "main" ] || { echo "main is not checked out"; reward=0; }
git show main:calc.py | grep -q "^def subtract(a, b):" || { echo "main has no subtract"; reward=0; }
git merge-base --is-ancestor feature/subtract main || { echo "feature/subtract is not merged"; reward=0; }
echo $reward > /logs/verifier/reward.txt
