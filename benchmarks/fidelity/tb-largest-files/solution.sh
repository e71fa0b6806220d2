#!/bin/bash
find /data -type f -printf '%s %p\n' | sort -k1,1nr | head -n 3 > /app/largest.txt
cat /app/largest.txt
