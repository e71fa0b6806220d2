#!/bin/bash
# The project's own uv (copied from the uv image) runs the tests on the image's Python 3.13,
# with nothing to download: unittest is in the standard library.
cd /app
if [ "$(uv --version | cut -d' ' -f2)" = 0.8.15 ] \
   && uv run --no-project --python 3.13 --offline python -m unittest discover -s /tests -p 'test_*.py' -v; then
  echo 1 > /logs/verifier/reward.txt
else
  uv --version
  echo 0 > /logs/verifier/reward.txt
fi
