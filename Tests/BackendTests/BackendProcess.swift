import Foundation
import PylonClientKit
import TestSupport

/// The secrets every `BackendProcess` is started with (`auth: true`): `RawHTTPClient.message`
/// sends the operator token to /v1/admin, /v1/inspect and /v1/faults and the enrolment secret
/// (the fleet-level device key) to the other /v1 paths unless a request names its own
/// `Authorization` header (an empty value sends none).
enum TestCredentials {
    static let operatorToken = "test-operator-token-0123456789abcdef"
    static let deviceKey = "test-device-key-0123456789abcdef"

    /// Writes both (mode 0600) into `dir`; the backend arguments that use them (with `faults`,
    /// also the fault API and `/v1/admin/reset`, which the tests use to start over).
    static func arguments(_ dir: String, faults: Bool = true) throws -> [String] {
        for (name, v) in [("operator.token", operatorToken), ("enrol.secret", deviceKey)] {
            let p = dir + "/" + name
            try (v + "\n").write(toFile: p, atomically: true, encoding: .utf8)
            chmod(p, 0o600)
        }
        return ["--operator-token-file", dir + "/operator.token", "--enrol-secret-file", dir + "/enrol.secret"]
            + (faults ? ["--enable-fault-injection", "--enable-reset"] : [])
    }

    /// The header `RawHTTPClient.message` adds for `target`.
    static func header(for target: String) -> (String, String)? {
        let raw = target.split(separator: "?").first.map(String.init) ?? target
        let path = raw.removingPercentEncoding ?? raw
        for p in ["/v1/admin/", "/v1/inspect/", "/v1/faults"] where path.hasPrefix(p) {
            return ("Authorization", "Bearer " + operatorToken)
        }
        return path.hasPrefix("/v1/") ? ("Authorization", "Bearer " + deviceKey) : nil
    }
}

/// A real `pylon-backend` on 127.0.0.1 with a free port, its stderr in a temporary log file.
final class BackendProcess {
    let process = Process()
    let dir: String
    let logPath: String
    private(set) var port: UInt16 = 0

    /// The `--db` arguments it was started with (empty: SQLite in memory); another
    /// `BackendProcess(database:)` with them uses the same store.
    let database: [String]

    /// Starts the binary with `--listen 127.0.0.1:0` plus `arguments` and waits for its
    /// `pylon-backend listening on HOST:PORT` line.
    /// `auth`: with `TestCredentials` and the fault API. `store`: a new empty store of that kind
    /// (PostgreSQL: a new database on `PostgresServer.shared()`), unless `database` names one.
    init(
        _ arguments: [String] = [], dir existing: String? = nil, auth: Bool = true, store: StoreKind = .sqlite,
        database: [String]? = nil
    ) throws {
        dir = existing ?? NSTemporaryDirectory() + "pylon-backend-test-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        self.database = try database ?? store.databaseArguments()
        let arguments = (auth ? try TestCredentials.arguments(dir) : []) + self.database + arguments
        logPath = dir + "/backend.log"
        process.executableURL = URL(fileURLWithPath: binDir + "/pylon-backend")
        process.arguments = ["--listen", "127.0.0.1:0", "--log-level", "debug"] + arguments
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        log.seekToEndOfFile()
        process.standardError = log
        let out = Pipe()
        process.standardOutput = out
        try process.run()
        let line: String
        do {
            line = try BackendProcess.readLine(out.fileHandleForReading.fileDescriptor, timeoutMs: 10_000)
        } catch {
            stop()
            throw TestFailure(description: "\(error); log: \(logText)")
        }
        let prefix = "pylon-backend listening on 127.0.0.1:"
        guard line.hasPrefix(prefix), let p = UInt16(line.dropFirst(prefix.count)) else {
            stop()
            throw TestFailure(description: "unexpected first line \(line.debugDescription); log: \(logText)")
        }
        port = p
    }

    private static func readLine(_ fd: Int32, timeoutMs: Int32) throws -> String {
        var bytes: [UInt8] = []
        var c: UInt8 = 0
        while true {
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&pfd, 1, timeoutMs) == 1 else { throw TestFailure(description: "backend printed no address") }
            guard read(fd, &c, 1) == 1 else { throw TestFailure(description: "backend stdout closed") }
            if c == 0x0A { return String(decoding: bytes, as: UTF8.self) }
            bytes.append(c)
        }
    }

    func client() throws -> RawHTTPClient { try RawHTTPClient(port: port) }

    /// One request on a fresh connection.
    func request(_ method: String, _ target: String, headers: [(String, String)] = [], body: [UInt8] = []) throws -> HTTPReply {
        try client().request(method, target, headers: headers, body: body)
    }

    func get(_ target: String) throws -> JSON { try request("GET", target).json() }

    /// POSTs a batch as JSON; `key` becomes the Idempotency-Key header.
    func postBatch(_ stream: String, key: String?, _ body: JSON) throws -> HTTPReply {
        try client().postBatch(stream, key: key, body)
    }

    func setFaults(_ faults: JSON) throws {
        let r = try request("POST", "/v1/faults", body: Array(faults.serialized.utf8))
        guard r.status == 200 else { throw TestFailure(description: "POST /v1/faults: \(r.status) \(r.text)") }
    }

    var logText: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// Sends SIGTERM and waits; returns the exit status (-1 if it had to be killed).
    @discardableResult
    func stop() -> Int32 { TestSupport.stop(process, graceSeconds: 10) }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: dir)
    }
}

/// A batch body in the uploader's format.
func batchBody(key: String, stream: String, ids: [String], ts: Int64 = 1_700_000_000_000) -> JSON {
    .object([
        "batch": .string(key), "stream": .string(stream),
        "records": .array(ids.map { ["id": .string($0), "ts": .int(ts), "data": ["name": .string("event-\($0)"), "n": 1]] }),
    ])
}
