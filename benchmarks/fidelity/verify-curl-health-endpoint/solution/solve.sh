#!/bin/bash
set -euo pipefail
cat > /app/server.py <<'PY'
import json
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlparse


class Handler(BaseHTTPRequestHandler):
    def reply(self, status, body, kind="text/plain"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        url = urlparse(self.path)
        if url.path == "/healthz":
            return self.reply(200, "ok")
        if url.path == "/sum":
            query = parse_qs(url.query)
            try:
                total = int(query["a"][0]) + int(query["b"][0])
            except (KeyError, ValueError):
                return self.reply(400, "bad request")
            return self.reply(200, json.dumps({"sum": total}), "application/json")
        return self.reply(404, "not found")


HTTPServer(("0.0.0.0", 9000), Handler).serve_forever()
PY
nohup python3 /app/server.py > /app/server.log 2>&1 &
sleep 1
