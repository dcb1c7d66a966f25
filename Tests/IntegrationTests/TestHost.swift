import Foundation
import PylonClientKit
import TestSupport

let fixturesDir = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .appendingPathComponent("fixtures").path

/// A real `pylond` with its own temporary socket, state directory and configuration.
final class TestHost {
    let dir: String
    let socket: String
    let stateDir: String
    let configPath: String
    let logPath: String
    private(set) var process: Process?

    /// - Parameters:
    ///   - plugins: the `plugins` array of the config (default: the Swift echo plugin).
    ///   - extra: more top-level config keys (limits, permissions, ...).
    init(plugins: [JSON]? = nil, extra: JSONObject = [:], stateDir existing: String? = nil) throws {
        dir = NSTemporaryDirectory() + "pylon-test-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        socket = dir + "/pylon.sock"
        stateDir = existing ?? dir + "/state"
        configPath = dir + "/pylon.json"
        logPath = dir + "/pylond.log"
        var cfg: JSONObject = [
            "socket": .string(socket), "stateDir": .string(stateDir), "pluginDir": .string(binDir),
            "logLevel": "debug",
            "plugins": .array(plugins ?? [TestHost.echo()]),
        ]
        for (k, v) in extra { cfg[k] = v }
        try JSON.object(cfg).serialized.write(toFile: configPath, atomically: true, encoding: .utf8)
        try start()
    }

    /// The Swift echo plugin with fast supervision settings for tests.
    static func echo(name: String = "echo", _ extra: JSONObject = [:]) -> JSON {
        var o: JSONObject = [
            "name": .string(name), "exec": "pylon-echo", "backoffInitialMs": 50, "backoffMaxMs": 500,
            "heartbeatIntervalMs": 200, "heartbeatTimeoutMs": 2000, "stopGraceMs": 1000,
        ]
        for (k, v) in extra { o[k] = v }
        return .object(o)
    }

    func start() throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylond")
        p.arguments = ["--config", configPath]
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        log.seekToEndOfFile()
        p.standardError = log
        p.standardOutput = log
        var env = ProcessInfo.processInfo.environment
        env["PYLON_SOCKET"] = nil
        env["PYLON_STATE_DIR"] = nil
        p.environment = env
        try p.run()
        process = p
        try waitUntil(timeout: 10) {
            guard let c = try? SyncClient(path: socket), let s = try? c.call("bus.status", nil, timeoutMs: 2000) else { return false }
            return s["state"]?.stringValue == "running"
        }
    }

    var pid: Int32 { process?.processIdentifier ?? -1 }

    func client() throws -> SyncClient { try SyncClient(path: socket) }

    func status() throws -> JSON { try client().call("bus.status", nil, timeoutMs: 5000) }

    func plugin(_ name: String = "echo") throws -> JSON {
        guard let p = try status()["plugins"]?.arrayValue?.first(where: { $0["name"]?.stringValue == name }) else {
            throw TestFailure(description: "no plugin \(name) in bus.status")
        }
        return p
    }

    /// Waits until the plugin is running with at least `restarts` restarts.
    func waitForPlugin(_ name: String = "echo", state: String = "running", restartsAtLeast: Int = 0, timeout: Double = 10) throws {
        try waitUntil(timeout: timeout) {
            guard let p = try? plugin(name) else { return false }
            return p["state"]?.stringValue == state && (p["restarts"]?.intValue ?? 0) >= Int64(restartsAtLeast)
        }
    }

    /// Sends SIGTERM and waits for the process to exit; returns its exit status.
    @discardableResult
    func stop() -> Int32 {
        guard let p = process else { return 0 }
        return TestSupport.stop(p, graceSeconds: 15)
    }

    func kill9() {
        guard let p = process, p.isRunning else { return }
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
    }

    var logText: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: dir)
    }
}

func isAlive(_ pid: Int32) -> Bool {
    // A zombie (exited, not yet reaped) counts as dead.
    guard kill(pid, 0) == 0 else { return false }
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8) else { return false }
    let afterComm = stat.split(separator: ")").last ?? ""
    return !afterComm.trimmingCharacters(in: .whitespaces).hasPrefix("Z")
}

extension SyncClient {
    /// Sends a raw line and reads the next message.
    func roundTrip(_ line: String, timeoutMs: Int = 5000) throws -> JSON {
        try sendLine(line)
        guard let m = try readMessage(timeoutMs: timeoutMs) else { throw TestFailure(description: "no reply to \(line.prefix(80))") }
        return m
    }
}

extension JSON {
    var errorCode: Int64? { self["error"]?["code"]?.intValue }
}

extension TestHost {
    /// Sends `lines` from a separate client process running as `uid`/`gid` (an unprivileged
    /// local user, as an attacker would be), and returns its replies and notifications. The
    /// host must have been started with a socket that uid can reach (`socketMode` 0666).
    /// `sequential`: each line gets id N (its index) and is sent after the previous reply.
    func runAs(
        uid: UInt32 = 65534, gid: UInt32? = nil, sequential: Bool = false,
        _ lines: [String]
    ) throws -> (replies: [JSON], notifications: [JSON]) {
        try startAs(uid: uid, gid: gid, sequential: sequential, lines).wait()
    }

    /// `runAs` without waiting: the client runs until every request is answered.
    func startAs(uid: UInt32 = 65534, gid: UInt32? = nil, sequential: Bool = false, _ lines: [String]) throws -> ForeignClient {
        let script = try String(contentsOfFile: fixturesDir + "/rpc_client.py", encoding: .utf8)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        // setpriv leaves the system Python reachable for any uid (pyenv shims live under /root).
        p.arguments =
            ["--reuid=\(uid)", "--regid=\(gid ?? uid)", "--clear-groups", "/usr/bin/python3", "-c", script, socket]
            + (sequential ? ["--sequential"] : [])
        let input = Pipe()
        let output = Pipe()
        p.standardInput = input
        p.standardOutput = output
        try p.run()
        input.fileHandleForWriting.write(Data(lines.map { $0 + "\n" }.joined().utf8))
        try input.fileHandleForWriting.close()
        return ForeignClient(process: p, output: output)
    }

    /// A host whose socket any local user can reach, for tests with unprivileged clients.
    static func open(plugins: [JSON]? = nil, extra: JSONObject = [:]) throws -> TestHost {
        var e = extra
        e["socketMode"] = "0666"
        return try TestHost(plugins: plugins, extra: e)
    }
}

/// A client process started by `TestHost.startAs`.
struct ForeignClient {
    let process: Process
    let output: Pipe

    func wait() throws -> (replies: [JSON], notifications: [JSON]) {
        let data = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        var replies: [JSON] = []
        var notes: [JSON] = []
        for line in String(decoding: data, as: UTF8.self).split(separator: "\n") {
            if line.hasPrefix("notification ") {
                notes.append(try JSON.parse(String(line.dropFirst("notification ".count))))
            } else {
                replies.append(try JSON.parse(String(line)))
            }
        }
        return (replies, notes)
    }
}
