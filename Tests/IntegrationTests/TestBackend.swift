import Foundation
import PylonClientKit
import TestSupport

/// A real `pylon-backend` on a free loopback port with its own database, an operator token and
/// an enrolment secret (the fleet-level device key plugins name as `credentialFile`), and the
/// fault API (`--enable-fault-injection`).
final class TestBackend {
    let dir: String
    let process: Process
    let port: Int
    var baseURL: String { "http://127.0.0.1:\(port)" }
    static let operatorToken = "itest-operator-token-0123456789abcdef"
    static let deviceKey = "itest-device-key-0123456789abcdef"
    /// The device key file (0600) plugins present (`credentialFile`).
    var credentialFile: String { dir + "/device.key" }

    /// - Parameter mqttPort: a broker on loopback for the push API (`--mqtt`).
    /// - Parameter broker: a broker on loopback for the push API (`--mqtt`), whose dynsec admin
    ///   this backend is.
    /// - Parameter args: more command-line arguments (a broker cluster's `--mqtt` list and auth).
    init(maxBody: Int? = nil, broker: TestBroker? = nil, args: [String] = []) throws {
        dir = NSTemporaryDirectory() + "pylon-backend-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        for (name, v) in [("operator.token", TestBackend.operatorToken), ("device.key", TestBackend.deviceKey)] {
            try (v + "\n").write(toFile: dir + "/" + name, atomically: true, encoding: .utf8)
            chmod(dir + "/" + name, 0o600)
        }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylon-backend")
        p.arguments =
            [
                "--listen", "127.0.0.1:0", "--db", dir + "/backend.db", "--operator-token-file", dir + "/operator.token",
                "--enrol-secret-file", dir + "/device.key", "--enable-fault-injection",
            ] + (maxBody.map { ["--max-body", String($0)] } ?? [])
            + (broker.map {
                [
                    "--mqtt", "127.0.0.1:\($0.port)", "--mqtt-username", TestBroker.adminUser, "--mqtt-password-file",
                    $0.adminPasswordFile, "--mqtt-dynsec",
                ]
            } ?? []) + args
        _ = FileManager.default.createFile(atPath: dir + "/backend.log", contents: nil)
        p.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: dir + "/backend.log"))
        process = p
        // First stdout line: "pylon-backend listening on 127.0.0.1:PORT".
        let port = try runReportingPort(p, "backend")
        self.port = port
    }

    deinit {
        if process.isRunning { process.terminate(); process.waitUntilExit() }
        try? FileManager.default.removeItem(atPath: dir)
    }

    /// A minimal HTTP/1.1 exchange over a fresh connection (Connection: close).
    /// `auth`: the bearer token sent (nil: none); by default the operator token for /v1/admin,
    /// /v1/inspect and /v1/faults and the device key for the other /v1 paths.
    func request(_ method: String, _ path: String, body: JSON? = nil, auth: String?? = .none) throws -> (status: Int, json: JSON) {
        let token: String? =
            switch auth {
            case .some(let t): t
            case .none:
                ["/v1/admin/", "/v1/inspect/", "/v1/faults"].contains(where: { path.hasPrefix($0) })
                    ? TestBackend.operatorToken : (path.hasPrefix("/v1/") ? TestBackend.deviceKey : nil)
            }
        let r = try httpExchange(
            port: port, method, path, body: body, headers: token.map { [("Authorization", "Bearer \($0)")] } ?? [])
        return (r.status, r.body.isEmpty ? .null : ((try? JSON.parse(r.body)) ?? .string(r.body)))
    }

    func stream(_ name: String) throws -> JSON { try request("GET", "/v1/inspect/streams/\(name)").json }
    /// Every record the backend holds for stream `name`, in order (all pages).
    func records(_ name: String) throws -> [JSON] {
        var out: [JSON] = []
        var after: Int64 = 0
        while true {
            let page = try request("GET", "/v1/inspect/streams/\(name)/records?limit=1000&after=\(after)").json
            let recs = page["records"]?.arrayValue ?? []
            if recs.isEmpty { break }
            out += recs
            guard let next = page["next"]?.intValue ?? recs.last?["rowid"]?.intValue, next > after else { break }
            after = next
        }
        return out
    }
    func recordIds(_ name: String) throws -> Set<String> { Set(try records(name).compactMap { $0["id"]?.stringValue }) }
    func faults(_ f: JSON) throws { _ = try request("POST", "/v1/faults", body: f) }
    func clearFaults() throws { _ = try request("DELETE", "/v1/faults") }
}

extension TestHost {
    /// The uploader plugin against `backend`, with per-stream overrides.
    static func uploader(_ backend: TestBackend, config extra: JSONObject = [:], _ plugin: JSONObject = [:]) -> JSON {
        var cfg: JSONObject = [
            "endpoint": .string(backend.baseURL + "/v1/batches/{stream}"), "credentialFile": .string(backend.credentialFile),
            "retryInitialMs": 100, "retryMaxMs": 2000,
        ]
        for (k, v) in extra { cfg[k] = v }
        var o: JSONObject = [
            "name": "uploader", "exec": "pylon-uploader", "config": .object(cfg),
            "backoffInitialMs": 50, "heartbeatIntervalMs": 500, "heartbeatTimeoutMs": 5000,
        ]
        for (k, v) in plugin { o[k] = v }
        return .object(o)
    }
}

/// `n` records with ids `prefix-0 ...`.
func records(_ prefix: String, _ range: Range<Int>, pad: Int = 0) -> JSON {
    .array(
        range.map { i in
            ["id": .string("\(prefix)-\(i)"), "data": ["n": .int(Int64(i)), "pad": .string(String(repeating: "p", count: pad))]]
        })
}
