import Foundation
import PylonClientKit
import PylonProtocol

/// A private pylond for a Swift test: its own directory (socket, state, configuration, log)
/// under the temporary directory, free of the system's, with the plugins the test chooses; a
/// fake for a namespace no plugin serves is a `FakeProvider`. The Swift side of
/// `pylon.testing` (docs/TESTING-APPS.md):
///
/// ```swift
/// let host = try PrivateHost(plugins: [.real("uploader")])
/// let push = try host.fake("push", answers: ["push.bind": .success(["code": 0, "message": ""])])
/// try myApp.login(socket: host.socket, user: "alice")
/// #expect(push.calls("push.bind").first?.params?["userId"] == "alice")
/// ```
///
/// pylond comes from `$PYLON_BUILD_DIR`, else `pylond` on `PATH`, else `/usr/bin`; real plugins
/// (`pylon-NAME`) are found next to it.
public final class PrivateHost {
    /// One plugin of the host.
    public enum Plugin {
        /// The real plugin `pylon-NAME`, with its `config`.
        case real(String, config: JSON = .object([:]))
        /// Any executable that speaks the plugin protocol.
        case exec(String, path: String, args: [String] = [], config: JSON = .object([:]))
        /// A whole `plugins` entry of pylon.json.
        case entry(JSON)

        var json: JSON {
            switch self {
            case .real(let n, let c): return ["name": .string(n), "exec": .string("pylon-" + n), "config": c]
            case .exec(let n, let p, let a, let c):
                return ["name": .string(n), "exec": .string(p), "args": .array(a.map { .string($0) }), "config": c]
            case .entry(let e): return e
            }
        }
    }

    public let dir: String
    public let socket: String
    public let pylond: String
    public let configPath: String
    public let logPath: String
    private var process: Process?
    private var fakes: [FakeProvider] = []

    /// Starts pylond (from `buildDir`, else as the type's documentation says) with `plugins`
    /// and `config` (more members of the host configuration) and waits until every plugin runs.
    public init(plugins: [Plugin], config extra: JSONObject = [:], buildDir: String? = nil, startTimeout: Double = 20) throws {
        pylond = try PrivateHost.findPylond(buildDir)
        dir = NSTemporaryDirectory() + "pylon-test-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        socket = dir + "/pylon.sock"
        configPath = dir + "/pylon.json"
        logPath = dir + "/pylond.log"
        var cfg: JSONObject = [
            "socket": .string(socket), "stateDir": .string(dir + "/state"), "logLevel": "debug",
            "pluginDir": .string((pylond as NSString).deletingLastPathComponent),
        ]
        // A test's clients may provide the shipped plugins' namespaces (`fake`): a private host
        // reserves none (the installed one reserves ma, push, gtm, uploader).
        cfg["disclosure"] = ["reservedNamespaces": []]
        for (k, v) in extra { cfg[k] = v }
        cfg["plugins"] = .array(plugins.map(\.json))
        try JSON.object(cfg).serialized.write(toFile: configPath, atomically: true, encoding: .utf8)
        try start(timeout: startTimeout)
    }

    static func findPylond(_ buildDir: String?) throws -> String {
        var candidates: [String] = buildDir.map { [$0 + "/pylond"] } ?? []
        if let d = ProcessInfo.processInfo.environment["PYLON_BUILD_DIR"] { candidates.append(d + "/pylond") }
        for d in (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":") { candidates.append(d + "/pylond") }
        candidates.append("/usr/bin/pylond")
        guard let p = candidates.first(where: { FileManager.default.isExecutableFile(atPath: $0) }) else {
            throw PrivateHostError(description: "pylond not found (set PYLON_BUILD_DIR to the directory that holds it)")
        }
        return p
    }

    /// Starts pylond (again, on the same socket after `kill`) and waits until every plugin runs.
    public func start(timeout: Double = 20) throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: pylond)
        p.arguments = ["--config", configPath]
        if !FileManager.default.fileExists(atPath: logPath) { _ = FileManager.default.createFile(atPath: logPath, contents: nil) }
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        log.seekToEndOfFile()
        p.standardError = log
        p.standardOutput = log
        p.environment = ProcessInfo.processInfo.environment.filter { !$0.key.hasPrefix("PYLON_") }
        try p.run()
        process = p
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if !p.isRunning { throw PrivateHostError(description: "pylond exited: " + logText) }
            if let c = try? SyncClient(path: socket), let s = try? c.call(HostMethod.status, nil, timeoutMs: 2000),
                (s["plugins"]?.arrayValue ?? []).allSatisfy({ $0["state"]?.stringValue == "running" })
            {
                return
            }
            usleep(20_000)
        }
        throw PrivateHostError(description: "pylond's plugins were not all running within \(timeout) s: " + logText)
    }

    /// A new connection to the host.
    public func client() throws -> SyncClient { try SyncClient(path: socket) }

    /// One call on a connection of its own.
    public func call(_ method: String, _ params: JSON? = nil) throws -> JSON { try client().call(method, params, timeoutMs: 10_000) }

    /// The plugin's state in `bus.status`.
    public func pluginState(_ name: String) throws -> String? {
        try call(HostMethod.status)["plugins"]?.arrayValue?.first { $0["name"]?.stringValue == name }?["state"]?.stringValue
    }

    /// A fake serving `namespace.*` methods through `bus.provide` (a namespace no plugin of this
    /// host has; the private host reserves none, so `push` may be one): it records each call
    /// and answers from `answers` (full method names; others it does not serve). Unlike a
    /// plugin it has no manifest: no consent switch is checked. Python's `pylon.testing.Fake`
    /// is a real plugin process, for consent, publications, hangs and crashes.
    public func fake(_ namespace: String, answers: [String: Result<JSON, RPCError>]) throws -> FakeProvider {
        let f = try FakeProvider(socket: socket, answers: answers)
        fakes.append(f)
        return f
    }

    /// pylond's log so far.
    public var logText: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// Kills pylond at once (SIGKILL), as a crash would.
    public func kill() {
        guard let p = process, p.isRunning else { return }
        Foundation.kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
    }

    /// Stops pylond (SIGTERM; it stops its plugins) and waits for it.
    public func stop() {
        for f in fakes { f.stop() }
        fakes.removeAll()
        guard let p = process, p.isRunning else { return }
        p.terminate()
        p.waitUntilExit()
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: dir)
    }
}

public struct PrivateHostError: Error, CustomStringConvertible {
    public let description: String
}

/// A fake behind `bus.provide`: a connection of the test that serves some methods on a thread
/// of its own, records each call and answers as told.
public final class FakeProvider: @unchecked Sendable {
    /// One call the fake received.
    public struct Call: Sendable {
        public let method: String
        public let params: JSON?
    }

    private let lock = NSLock()
    private var answers: [String: Result<JSON, RPCError>]
    private var received: [Call] = []
    private var stopped = false
    private let client: SyncClient
    private var thread: Thread?

    init(socket: String, answers: [String: Result<JSON, RPCError>]) throws {
        self.answers = answers
        client = try SyncClient(path: socket)
        _ = try client.call(HostMethod.provide, ["methods": .array(answers.keys.sorted().map { .string($0) })], timeoutMs: 10_000)
        let t = Thread { [weak self] in self?.serve() }
        thread = t
        t.start()
    }

    /// The calls received so far (of `method`), oldest first.
    public func calls(_ method: String? = nil) -> [Call] {
        lock.lock()
        defer { lock.unlock() }
        return received.filter { method == nil || $0.method == method }
    }

    /// Answers `method` with `answer` from now on.
    public func answer(_ method: String, _ answer: Result<JSON, RPCError>) {
        lock.lock()
        answers[method] = answer
        lock.unlock()
    }

    func stop() {
        lock.lock()
        stopped = true
        lock.unlock()
    }

    private func serve() {
        while true {
            lock.lock()
            let done = stopped
            lock.unlock()
            if done { return }
            let read: JSON?
            do { read = try client.readMessage(timeoutMs: 100) } catch { return }  // the host went away
            guard let m = read else { continue }
            guard let method = m["method"]?.stringValue, let id = m["id"] else { continue }
            lock.lock()
            received.append(Call(method: method, params: m["params"]))
            let a = answers[method] ?? .success(.object([:]))
            lock.unlock()
            var reply: JSONObject = ["jsonrpc": "2.0", "id": id]
            switch a {
            case .success(let r): reply["result"] = r
            case .failure(let e): reply["error"] = e.json
            }
            try? client.sendLine(JSON.object(reply).serialized)
        }
    }
}
