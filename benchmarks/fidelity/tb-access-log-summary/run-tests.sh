#!/bin/bash

# pytest comes with the t-bench base image.
cd /app
python3 -m pytest $TEST_DIR/test_outputs.py -rA
