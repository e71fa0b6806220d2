#!/bin/bash
expected=$'The deployment key is in the vault under "harbor-prod".\nRotate it on Monday.'

reward=1
if [ "$(cat /app/note.txt 2>/dev/null)" != "$expected" ]; then
  echo "note.txt does not hold the decoded note"
  reward=0
fi
if ! command -v rot13 >/dev/null; then
  echo "rot13 is gone"
  reward=0
fi
if command -v gcc >/dev/null; then
  echo "the final image should not contain a compiler"
  reward=0
fi
echo $reward > /logs/verifier/reward.txt
