#!/bin/bash
set -euo pipefail
cat > /app/count_primes.py <<'PY'
import sys


def count_primes(n: int) -> int:
    if n < 3:
        return 0
    sieve = bytearray([1]) * n
    sieve[0] = sieve[1] = 0
    for p in range(2, int(n ** 0.5) + 1):
        if sieve[p]:
            sieve[p * p :: p] = bytes(len(range(p * p, n, p)))
    return sum(sieve)


if __name__ == "__main__":
    print(count_primes(int(sys.argv[1])))
PY
python3 /app/count_primes.py 100
