import Foundation
import PylonClientKit
import TestSupport

/// A tiny HTTP server for the uploader's tests (Python's `http.server`, run from a script this
/// file writes): it answers every request with the next status of a script set through
/// `POST /_control` (then `default`, 200 unless set), a 3xx with a `Location`, and logs each
/// request (method, path, the status it got). It needs no fault API of the reference backend:
/// it answers 401, 403 and redirects, which that API cannot inject, and it takes pixel GETs to
/// any path.
final class UploaderTestServer {
    let dir: String
    let process: Process
    let port: Int
    var baseURL: String { "http://127.0.0.1:\(port)" }

    static let script = #"""
        import http.server, json, threading
        lock = threading.Lock()
        state = {"statuses": [], "default": 200, "log": []}
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            def log_message(self, *args):
                pass
            def reply(self, status, body):
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", "http://127.0.0.1:1/elsewhere")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            def any(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                with lock:
                    if self.path == "/_control":
                        c = json.loads(body or b"{}")
                        state["statuses"] = list(c.get("statuses", []))
                        state["default"] = c.get("default", 200)
                        out = (200, b"{}")
                    elif self.path == "/_log":
                        out = (200, json.dumps(state["log"]).encode())
                    else:
                        status = state["statuses"].pop(0) if state["statuses"] else state["default"]
                        state["log"].append({"method": self.command, "path": self.path, "status": status})
                        out = (status, b"{}")
                self.reply(*out)
            do_GET = do_POST = do_PUT = do_DELETE = any
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        print("listening on 127.0.0.1:%d" % server.server_address[1], flush=True)
        server.serve_forever()
        """#

    init() throws {
        dir = NSTemporaryDirectory() + "pylon-upl-server-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        try Self.script.write(toFile: dir + "/server.py", atomically: true, encoding: .utf8)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        p.arguments = [dir + "/server.py"]
        process = p
        let port = try runReportingPort(p, "test server")
        self.port = port
    }

    deinit {
        // SIGKILL, not terminate(): a child Foundation spawns from a test thread inherits that
        // thread's signal mask, SIGTERM blocked included, so SIGTERM would never arrive and
        // waitUntilExit() would wait forever.
        if process.isRunning { kill(process.processIdentifier, SIGKILL); process.waitUntilExit() }
        try? FileManager.default.removeItem(atPath: dir)
    }

    /// The next requests get `statuses`, in order, then `default`.
    func answer(_ statuses: [Int], then fallback: Int = 200) throws {
        _ = try request(
            "POST", "/_control", body: ["statuses": .array(statuses.map { .int(Int64($0)) }), "default": .int(Int64(fallback))])
    }

    /// Every request served (not `/_control` or `/_log`): `method`, `path`, `status`.
    func log() throws -> [JSON] { try request("GET", "/_log").arrayValue ?? [] }

    /// One HTTP/1.1 exchange over a fresh connection (Connection: close); the body as JSON.
    func request(_ method: String, _ path: String, body: JSON? = nil) throws -> JSON {
        (try? JSON.parse(try httpExchange(port: port, method, path, body: body).body)) ?? .null
    }
}
