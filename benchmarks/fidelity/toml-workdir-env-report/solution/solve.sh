#!/bin/bash
printf '[service]\nowner = %s\ntier = %s\n' "$SERVICE_OWNER" "$SERVICE_TIER" > service.ini
cat service.ini
