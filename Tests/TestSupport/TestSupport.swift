import Foundation
import PylonCore

/// Helpers shared by the test targets that start real processes (IntegrationTests,
/// BackendTests); `RandomJSONText` is the differential tests' generator (BackendTests,
/// UploaderTests, MATests).

/// Where the built executables are: `$PYLON_BIN_DIR`, else `.build/debug` of this package.
public let binDir: String = {
    if let d = ProcessInfo.processInfo.environment["PYLON_BIN_DIR"] { return d }
    let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    return root.appendingPathComponent(".build/debug").path
}()

public struct TestFailure: Error, CustomStringConvertible {
    public let description: String
    public init(description: String) { self.description = description }
}

/// Polls `cond` every 20 ms until it is true (errors count as false); throws after `timeout` s.
public func waitUntil(timeout: Double, _ cond: () throws -> Bool) throws {
    let deadline = Date().addingTimeInterval(timeout)
    while Date() < deadline {
        if (try? cond()) == true { return }
        usleep(20_000)
    }
    throw TestFailure(description: "condition not met within \(timeout) s")
}

/// Sends SIGTERM and waits up to `graceSeconds`; returns the exit status, or -1 if the process
/// ignored SIGTERM and had to be killed (never hang a test run on it: that is a failure).
@discardableResult
public func stop(_ p: Process, graceSeconds: Double) -> Int32 {
    guard p.isRunning else { return p.terminationStatus }
    p.terminate()
    let deadline = Date().addingTimeInterval(graceSeconds)
    while p.isRunning && Date() < deadline { usleep(10_000) }
    if p.isRunning {
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
        return -1
    }
    return p.terminationStatus
}

/// Starts `p` (its executable, arguments and stderr already set) with a pipe on stdout and
/// returns the port its first stdout line ends with (`… listening on 127.0.0.1:PORT`: a server
/// bound to port 0 says which one it got). `what` names it in the error. If no port comes within
/// 10 s the process is killed (SIGKILL: a child spawned from a test thread may have SIGTERM
/// blocked) and an error is thrown.
public func runReportingPort(_ p: Process, _ what: String) throws -> Int {
    let out = Pipe()
    p.standardOutput = out
    try p.run()
    var line = Data()
    let deadline = Date().addingTimeInterval(10)
    while Date() < deadline {
        let b = out.fileHandleForReading.availableData
        if b.isEmpty { break }
        line.append(b)
        if line.contains(0x0A) { break }
    }
    let text = String(decoding: line, as: UTF8.self)
    guard let portText = text.split(separator: ":").last?.split(separator: "\n").first, let port = Int(portText) else {
        kill(p.processIdentifier, SIGKILL)
        p.waitUntilExit()
        throw TestFailure(description: "\(what) did not report its port: \(text)")
    }
    return port
}

/// One HTTP/1.1 exchange with a server on 127.0.0.1:`port` over a fresh connection
/// (`Connection: close`): the status and the body as text. `body` is sent as JSON.
public func httpExchange(
    port: Int, _ method: String, _ path: String, body: JSON? = nil, headers: [(String, String)] = []
) throws -> (status: Int, body: String) {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = UInt16(port).bigEndian
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    let rc = withUnsafePointer(to: &addr) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard rc == 0 else { throw TestFailure(description: "cannot connect to 127.0.0.1:\(port)") }
    let payload = body.map { Array($0.serialized.utf8) } ?? []
    var req = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: \(payload.count)\r\n"
    if body != nil { req += "Content-Type: application/json\r\n" }
    for (k, v) in headers { req += "\(k): \(v)\r\n" }
    req += "\r\n"
    let bytes = Array(req.utf8) + payload
    _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
    var resp = [UInt8]()
    var buf = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, 65536, 0) }
        if n <= 0 { break }
        resp.append(contentsOf: buf[0..<n])
    }
    let text = String(decoding: resp, as: UTF8.self)
    guard let sep = text.range(of: "\r\n\r\n") else { throw TestFailure(description: "bad HTTP response: \(text.prefix(200))") }
    return (Int(text.split(separator: " ").dropFirst().first ?? "") ?? 0, String(text[sep.upperBound...]))
}

/// How many times a server on ports chosen free (`onFreePorts`) is started again on new ones
/// because another process took one of them between the choice and the server's bind.
public let freePortAttempts = 5

/// What one start of a server on chosen ports came to (`onFreePorts`).
public enum PortStart<T> {
    case started(T)
    /// Another process took one of the ports in between ("address already in use"); the text
    /// says what the server said.
    case taken(String)
}

/// The one way the tests give ports to servers that cannot bind port 0 and say which port they
/// got (mosquitto 2.0.11: `listener 0` is a Unix socket to it; a nats-server cluster, whose
/// nodes must know each other's route ports before any starts). Chooses `count` distinct free
/// loopback ports and calls `start` with them; when `start` says one was taken in between (the
/// server's own log decides, never a probe of the port: something else may answer there), it
/// chooses new ones, up to `freePortAttempts` times. `what` names the server in the error.
public func onFreePorts<T>(_ count: Int, _ what: String, _ start: ([Int]) throws -> PortStart<T>) throws -> T {
    var last = "no attempt"
    for _ in 0..<freePortAttempts {
        switch try start(try chooseFreeLoopbackPorts(count)) {
        case .started(let value): return value
        case .taken(let why): last = why
        }
    }
    throw TestFailure(description: "\(what): a chosen port was taken \(freePortAttempts) times; last: \(last)")
}

/// Starts mosquitto on a free loopback port (`onFreePorts`), or on `port` (a broker started
/// again on its own port), and returns it with the port. mosquitto's own log decides: "…
/// running" means this broker listens there (not merely that something answers on the port);
/// "Address already in use" means another port. `conf(port)` is its configuration, which must
/// log to `log` (`log_dest file …`, the default log types). `unmaskSignals`: started through
/// python3, which clears the signal mask Foundation gives children (for a test that sends it
/// SIGHUP). A broker that is neither running nor refused within 10 s is killed (SIGKILL:
/// Foundation starts children with SIGTERM blocked) and an error is thrown.
public func startMosquitto(
    dir: String, log: String, port fixed: Int? = nil, unmaskSignals: Bool = false, conf: (Int) -> String
) throws -> (process: Process, port: Int) {
    func attempt(_ port: Int) throws -> PortStart<(process: Process, port: Int)> {
        try conf(port).write(toFile: dir + "/mosquitto.conf", atomically: true, encoding: .utf8)
        let from = (try? FileManager.default.attributesOfItem(atPath: log)[.size] as? Int) ?? 0
        let p = Process()
        if unmaskSignals {
            p.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            p.arguments = [
                "-c",
                "import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, set()); "
                    + "os.execv('/usr/sbin/mosquitto', ['mosquitto', '-c', sys.argv[1]])",
                dir + "/mosquitto.conf",
            ]
        } else {
            p.executableURL = URL(fileURLWithPath: "/usr/sbin/mosquitto")
            p.arguments = ["-c", dir + "/mosquitto.conf"]
        }
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        func logged() -> String {
            guard let d = FileManager.default.contents(atPath: log), d.count > from else { return "" }
            return String(decoding: d[from...], as: UTF8.self)
        }
        do {
            try waitUntil(timeout: 10) { !p.isRunning || logged().contains(" running") }
        } catch {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
            throw TestFailure(description: "mosquitto did not start within 10 s: \(logged())")
        }
        if p.isRunning { return .started((p, port)) }
        p.waitUntilExit()
        let said = logged()
        guard said.contains("Address already in use") else { throw TestFailure(description: "mosquitto did not start: \(said)") }
        return .taken(said)
    }
    if let fixed {
        guard case .started(let s) = try attempt(fixed) else {
            throw TestFailure(description: "mosquitto cannot listen on its port \(fixed) again: taken")
        }
        return s
    }
    return try onFreePorts(1, "mosquitto") { try attempt($0[0]) }
}

/// A loopback port nothing listens on now (bound to 0, read back, closed): for a port that must
/// refuse connections, and for `onFreePorts`.
public func chooseFreeLoopbackPort() throws -> Int { try chooseFreeLoopbackPorts(1)[0] }

/// `count` distinct loopback ports nothing listens on now: all bound to port 0 at once, read
/// back, then closed.
public func chooseFreeLoopbackPorts(_ count: Int) throws -> [Int] {
    var fds: [Int32] = []
    defer { for fd in fds { close(fd) } }
    var ports: [Int] = []
    for _ in 0..<count {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw TestFailure(description: "socket: errno \(errno)") }
        fds.append(fd)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let ok = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
        }
        guard ok else { throw TestFailure(description: "no free port") }
        ports.append(Int(UInt16(bigEndian: addr.sin_port)))
    }
    return ports
}

/// Debian's promtool (package prometheus), if installed.
public let promtoolPath = ["/usr/bin/promtool", "/usr/local/bin/promtool"].first { FileManager.default.isExecutableFile(atPath: $0) }

/// `promtool check metrics` of `text` (promtool at `promtool`): its exit status and what it printed.
public func promtoolCheck(_ text: String, promtool: String) throws -> (Int32, String) {
    try runWithInput(promtool, ["check", "metrics"], input: text)
}

/// Runs `path` with `arguments` and `input` on its standard input to completion: its exit status
/// and what it wrote to standard output and standard error together.
public func runWithInput(_ path: String, _ arguments: [String], input: String) throws -> (status: Int32, output: String) {
    let p = Process()
    p.executableURL = URL(fileURLWithPath: path)
    p.arguments = arguments
    let inp = Pipe()
    let out = Pipe()
    p.standardInput = inp
    p.standardOutput = out
    p.standardError = out
    try p.run()
    inp.fileHandleForWriting.write(Data(input.utf8))
    try inp.fileHandleForWriting.close()
    let said = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    p.waitUntilExit()
    return (p.terminationStatus, said)
}
