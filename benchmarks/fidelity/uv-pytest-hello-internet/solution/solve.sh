#!/bin/bash
echo "Hello, harbor!" > /app/greeting.txt
