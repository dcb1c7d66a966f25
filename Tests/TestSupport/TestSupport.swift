import Foundation

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
