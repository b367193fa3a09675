"""A local stand-in for W&B's HTTP API, for the live W&B logger's tests (tests/loggers/wandb_live_test.cpp,
tests/train/wandb_live_training_test.sh): it answers as api.wandb.ai answers the two requests the logger makes, and
records every request it gets, in order, one JSON line each (method, path, HTTP basic auth's user and password as
Python decodes them, body parsed as JSON, the status it answered) to RECORD, flushed as it answers.

  POST /graphql                                    UpsertBucket: {"data": {"upsertBucket": {"bucket": {...},
                                                   "inserted": true}}}, the bucket's fields as wandb's mutation asks
                                                   for them (wandb/sdk/internal/internal_api.py, upsert_run; wandb-core's
                                                   core/api/graphql/mutation_run.graphql); the entity is the request's,
                                                   else --entity (the key's default entity on W&B)
  POST /files/<entity>/<project>/<run>/file_stream  {"exitcode": null, "limits": {}}, as the file stream reads it

  wandb_recording_server.py RECORD [--mode ok|500|hold] [--fail-after N] [--entity NAME] [--port-file FILE]

--mode 500: every request is answered 500. --mode hold: no request is answered until a line `release` arrives on
stdin (the test's proof that the logger's calls do not wait on the network). --fail-after N: file_stream requests
after the first N are answered 500 (a network lost mid-run). It prints `PORT <n>` on stdout (and writes the number to
--port-file), and stops when its stdin closes: the test that started it holds the other end, so it never outlives it.
Only the standard library: any python runs it.
"""
import argparse
import base64
import http.server
import json
import os
import sys
import threading


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("record")
    parser.add_argument("--mode", choices=["ok", "500", "hold"], default="ok")
    parser.add_argument("--fail-after", type=int, default=-1)
    parser.add_argument("--entity", default="hpctrain-entity")
    parser.add_argument("--port-file")
    args = parser.parse_args()
    released = threading.Event()
    if args.mode != "hold":
        released.set()
    record = open(args.record, "a", encoding="utf-8")
    streamed = [0]  # file_stream requests answered so far

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as libcurl and W&B use it

        def log_message(self, *_):
            pass

        def answer(self, status, body):
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            text = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode("utf-8", "replace")
            try:
                body = json.loads(text)
            except ValueError:
                body = text
            released.wait()
            status, reply = 404, {"error": "not found"}
            if args.mode == "500":
                status, reply = 500, {"error": "internal server error"}
            elif self.path == "/graphql" and isinstance(body, dict) and "upsertBucket" in body.get("query", ""):
                variables = body.get("variables") or {}
                entity = variables.get("entity") or args.entity
                project = variables.get("project") or "uncategorized"
                status, reply = 200, {"data": {"upsertBucket": {
                    "bucket": {
                        "id": "UnVuOnYxOmhwY3RyYWlu",
                        "name": variables.get("name"),
                        "displayName": variables.get("displayName"),
                        "description": variables.get("description"),
                        "config": variables.get("config"),
                        "sweepName": None,
                        "project": {"id": "UHJvamVjdDp2MQ==", "name": project,
                                    "entity": {"id": "RW50aXR5OnYx", "name": entity}},
                        "historyLineCount": 0,
                    },
                    "inserted": True,
                }}}
            elif self.path.startswith("/files/") and self.path.endswith("/file_stream"):
                if 0 <= args.fail_after <= streamed[0]:
                    status, reply = 500, {"error": "internal server error"}
                else:
                    streamed[0] += 1
                    status, reply = 200, {"exitcode": None, "limits": {}}
            authorization = self.headers.get("Authorization") or ""
            basic = None  # [user, password] of HTTP basic auth, decoded here
            if authorization.startswith("Basic "):
                basic = base64.b64decode(authorization[6:]).decode().split(":", 1)
            record.write(json.dumps({"method": "POST", "path": self.path, "basic_auth": basic,
                                     "content_type": self.headers.get("Content-Type"),
                                     "body": body, "status": status}) + "\n")
            record.flush()
            self.answer(status, reply)

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as out:
            out.write(f"{port}\n")
        os.replace(args.port_file + ".tmp", args.port_file)
    print(f"PORT {port}", flush=True)

    def control():
        for line in sys.stdin:
            if line.strip() == "release":
                released.set()
        released.set()  # stdin closed: whoever started us is gone or done
        server.shutdown()

    threading.Thread(target=control, daemon=True).start()
    server.serve_forever()
    record.close()


if __name__ == "__main__":
    main()
