import PylonClientKit
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// `pylonctl conformance [--as NAME] [--config JSON] [--reference EXEC] [--] EXEC [ARG...]`:
/// starts two private pylonds in a directory of their own (never the system's socket or state),
/// one with the real plugin NAME (`pylon-NAME`, found as pylond finds plugins) and one with EXEC
/// as NAME, and checks EXEC against the real one's declared contract (`Conformance`). Prints one
/// line per finding (`FAIL METHOD: …`, `WARN METHOD: …`) and a summary; exit 0 when nothing
/// failed, 1 when something did, 69 when a host or plugin does not start.
let conformanceUsage = """
      EXEC [ARG...]     the implementation to check (put -- before it when an ARG starts with -)
      --as NAME         the real plugin it stands in for: push, ma, uploader, gtm (required)
      --config JSON     the plugins' "config" (both), default {}
      --reference EXEC  the real plugin's executable (default pylon-NAME, found as pylond finds plugins)
      Checks: every method of the real plugin present and described; params and result shapes
      as in the real one's OpenRPC document (bus.describe {"format":"openrpc"}); its consent
      switches; bad params (required ones missing, the first one of a wrong type) answered as
      the real one answers them; each result's shape. Each call waits at most --timeout (default 5 s).
      exit status: 0 conforms; 1 a FAIL line; 69 a host or plugin did not start; 64 usage.
    """

/// One private pylond for the check: its directory, config, process.
@MainActor final class PrivateHost {
    let dir: String
    let socket: String
    let pid: pid_t

    init(dir: String, tag: String, pylond: String, plugin: JSON) {
        self.dir = dir
        socket = dir + "/\(tag).sock"
        let config: JSON = [
            "socket": .string(socket), "stateDir": .string(dir + "/\(tag)-state"), "logLevel": "info",
            "limits": ["requestTimeoutMs": .int(Int64(conformanceCallMs))],
            "plugins": [plugin],
        ]
        let configPath = dir + "/\(tag).json"
        writeFile(configPath, config.prettySerialized + "\n")
        let log = dir + "/\(tag).log"
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0o600)
        posix_spawn_file_actions_adddup2(&actions, 1, 2)
        // Never the system's host: its socket, state and config come from this file only.
        let env = System.environment().filter {
            !$0.hasPrefix("PYLON_SOCKET=") && !$0.hasPrefix("PYLON_STATE_DIR=") && !$0.hasPrefix("PYLON_CONFIG=")
        }
        let argv = [pylond, "--config", configPath]
        var p: pid_t = 0
        let rc = withCStrings(argv) { a in withCStrings(env) { e in posix_spawnp(&p, pylond, &actions, nil, a, e) } }
        guard rc == 0 else { conformanceCleanup(dir); fail("cannot start \(pylond): \(String(cString: strerror(rc)))", code: 69) }
        pid = p
    }

    /// Waits until the plugin runs; nil when it does not within `ms` (the log's tail says why).
    func waitRunning(_ name: String, ms: Int) -> String? {
        let deadline = nowMs() + Int64(ms)
        var last = "pylond did not answer"
        while nowMs() < deadline {
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid { return "pylond exited: " + logTail() }
            if let c = try? SyncClient(path: socket), let s = try? c.call(HostMethod.status, nil, timeoutMs: 2_000) {
                let p = s["plugins"]?.arrayValue?.first { $0["name"]?.stringValue == name }
                let state = p?["state"]?.stringValue ?? "absent"
                if state == "running" { return nil }
                last = "plugin \(name) is \(state)" + (p?["failed_reason"]?.stringValue.map { ": " + $0 } ?? "")
                if state == "failed" { break }
            }
            usleep(20_000)
        }
        return last + "; pylond's log: " + logTail()
    }

    func logTail() -> String {
        let t = String(decoding: (try? System.readFile(atPath: socket.replacingSuffix(".sock", ".log"))) ?? [], as: UTF8.self)
        return String(t.suffix(1_500))
    }

    func stop() {
        kill(pid, SIGTERM)
        var status: Int32 = 0
        let deadline = nowMs() + 10_000
        while waitpid(pid, &status, WNOHANG) == 0 {
            if nowMs() > deadline {
                kill(pid, SIGKILL)
                waitpid(pid, &status, 0)
                return
            }
            usleep(10_000)
        }
    }
}

extension String {
    func replacingSuffix(_ old: String, _ new: String) -> String { hasSuffix(old) ? String(dropLast(old.count)) + new : self }
}

/// How long one call of the check may take (the private hosts' requestTimeoutMs): --timeout, else 5 s.
@MainActor var conformanceCallMs: Int { timeoutGiven ? timeoutMs : 5_000 }

func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafeMutablePointer<CChar>?>) -> R) -> R {
    var ptrs: [UnsafeMutablePointer<CChar>?] = strings.map { strdup($0) }
    ptrs.append(nil)
    defer { for p in ptrs { free(p) } }
    return ptrs.withUnsafeBufferPointer { body($0.baseAddress!) }
}

func writeFile(_ path: String, _ text: String) {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
    guard fd >= 0 else { fail("cannot write \(path): \(String(cString: strerror(errno)))", code: 69) }
    let bytes = Array(text.utf8)
    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    close(fd)
}

/// Removes the check's directory and everything in it (no links followed).
func conformanceCleanup(_ dir: String) {
    var p: pid_t = 0
    let argv = ["rm", "-rf", "--", dir]
    guard withCStrings(argv, { a in posix_spawnp(&p, "rm", nil, nil, a, environ) }) == 0 else { return }
    var status: Int32 = 0
    waitpid(p, &status, 0)
}

/// One call's answer as `Conformance.Outcome`.
@MainActor func conformanceCall(_ socket: String, _ probe: Conformance.Probe) -> Conformance.Outcome {
    guard let c = try? SyncClient(path: socket) else { return .noAnswer("cannot connect") }
    do {
        let m = try c.request(probe.method, probe.params, timeoutMs: conformanceCallMs + 2_000)
        if let e = m["error"] {
            let code = e["code"]?.intValue ?? 0
            if code == Int64(RPCError.Code.timeout.rawValue) || code == Int64(RPCError.Code.pending.rawValue) {
                return .noAnswer("error \(code)")
            }
            return .error(code: code, message: e["message"]?.stringValue ?? "")
        }
        return .result(m["result"] ?? .null)
    } catch {
        return .noAnswer(error.description)
    }
}

@MainActor func conformanceCommand(_ args: [String], name: String?, configText: String?, reference: String?) {
    guard let name, !name.isEmpty else { fail("conformance needs --as NAME (push, ma, uploader, gtm)\n" + conformanceUsage, code: 64) }
    guard let exec = args.first else { fail("conformance needs the EXEC to check\n" + conformanceUsage, code: 64) }
    let config = configText.map { parseJSON($0, what: "--config") } ?? .object([:])
    guard config.objectValue != nil else { fail("--config must be a JSON object", code: 64) }
    var pylond = "pylond"
    if let here = System.executableDirectory(), access(here + "/pylond", X_OK) == 0 { pylond = here + "/pylond" }
    var template = Array("/tmp/pylon-conformance-XXXXXX".utf8CString)
    guard let d = mkdtemp(&template) else { fail("mkdtemp: \(String(cString: strerror(errno)))", code: 69) }
    let dir = String(cString: d)
    let shown = args.joined(separator: " ")
    let absExec = exec.contains("/") && !exec.hasPrefix("/") ? currentDirectory() + "/" + exec : exec
    let realHost = PrivateHost(
        dir: dir, tag: "real", pylond: pylond,
        plugin: ["name": .string(name), "exec": .string(reference ?? "pylon-\(name)"), "config": config])
    let candHost = PrivateHost(
        dir: dir, tag: "candidate", pylond: pylond,
        plugin: [
            "name": .string(name), "exec": .string(absExec), "args": .array(args.dropFirst().map { .string($0) }), "config": config,
        ])
    func finish(_ code: Int32) -> Never {
        realHost.stop()
        candHost.stop()
        conformanceCleanup(dir)
        exit(code)
    }
    if let why = realHost.waitRunning(name, ms: 30_000) {
        Log.writeRaw("pylonctl: the real \(name) did not start: \(why)\n")
        finish(69)
    }
    if let why = candHost.waitRunning(name, ms: 30_000) {
        Log.writeRaw("pylonctl: \(shown) did not start as \(name): \(why)\n")
        finish(69)
    }
    func openrpc(_ h: PrivateHost) -> JSON {
        guard let c = try? SyncClient(path: h.socket), let d = try? c.call(HostMethod.describe, ["format": "openrpc"]) else {
            Log.writeRaw("pylonctl: bus.describe failed on the private host\n")
            finish(69)
        }
        return d
    }
    let ref = Conformance.methods(of: name, in: openrpc(realHost))
    let cand = Conformance.methods(of: name, in: openrpc(candHost))
    var findings = Conformance.compareDeclared(plugin: name, reference: ref, candidate: cand)
    var calls = 0
    for probe in Conformance.probes(reference: ref) where cand[probe.method] != nil {
        let theirs = conformanceCall(candHost.socket, probe)
        let real = probe.compare ? conformanceCall(realHost.socket, probe) : nil
        calls += 1
        findings += Conformance.judge(
            probe, plugin: name, reference: real, candidate: theirs, schema: ref[probe.method]?["result"]?["schema"] ?? .object([:]))
    }
    for f in findings { print(f.description) }
    let failed = findings.filter { $0.level == Conformance.Finding.Level.fail }
    let methodsFailed = Set(failed.map { $0.method }).count
    print(
        failed.isEmpty
            ? "\(shown) conforms to \(name): \(ref.count) methods, \(calls) calls checked"
            : "\(shown) does not conform to \(name): \(failed.count) problems in \(methodsFailed) of \(ref.count) methods")
    fflush(nil)
    finish(failed.isEmpty ? 0 : 1)
}

func currentDirectory() -> String {
    guard let p = getcwd(nil, 0) else { return "." }
    defer { free(p) }
    return String(cString: p)
}

/// Milliseconds of the monotonic clock.
func nowMs() -> Int64 { Int64(Loop.hrtimeNs / 1_000_000) }
