"""A tiny in-memory inventory API for the task (standard library only)."""

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ITEMS = {
    "A100": {"name": "bolts", "stock": 42},
    "A101": {"name": "nuts", "stock": 3},
    "B200": {"name": "washers", "stock": 0},
    "B201": {"name": "hinges", "stock": 5},
    "C300": {"name": "springs", "stock": 4},
}
RESTOCK_LOG = []


class Handler(BaseHTTPRequestHandler):
    def _send(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/items":
            return self._send(200, sorted(ITEMS))
        if self.path == "/log":
            return self._send(200, RESTOCK_LOG)
        if self.path.startswith("/items/"):
            item_id = self.path.split("/", 2)[2]
            if item_id in ITEMS:
                return self._send(200, {"id": item_id, **ITEMS[item_id]})
        return self._send(404, {"error": "not found"})

    def do_POST(self):
        if self.path != "/restock":
            return self._send(404, {"error": "not found"})
        length = int(self.headers.get("Content-Length", 0))
        try:
            body = json.loads(self.rfile.read(length))
            item = ITEMS[body["id"]]
            quantity = int(body["quantity"])
        except (ValueError, KeyError, TypeError):
            return self._send(400, {"error": "bad request"})
        item["stock"] += quantity
        RESTOCK_LOG.append({"id": body["id"], "quantity": quantity})
        return self._send(200, {"id": body["id"], **item})

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("0.0.0.0", 8000), Handler).serve_forever()
