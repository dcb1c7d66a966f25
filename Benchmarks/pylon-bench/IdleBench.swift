import PylonClientKit

#if canImport(Glibc)
import Glibc
#endif

/// `pylon-bench idle`: how often an idle install wakes up. Starts pylond with the four shipped
/// plugins, their backend and broker unreachable (no traffic: the push plugin keeps retrying its
/// registration, GTM its container), waits for them to settle, then counts each process's
/// context switches (`voluntary_ctxt_switches` + `nonvoluntary_ctxt_switches` in
/// /proc/PID/status) over `--seconds` (default 30 for this mode) and prints wake-ups per second.
func idleBench() throws {
    let duration = seconds == 5.0 ? 30.0 : seconds
    startHost(plugins: [
        ["name": "uploader", "exec": "pylon-uploader", "config": ["endpoint": "http://127.0.0.1:9/v1/batches/{stream}"]],
        ["name": "ma", "exec": "pylon-ma", "config": ["backend": "http://127.0.0.1:9"]],
        ["name": "push", "exec": "pylon-push", "config": ["backend": "http://127.0.0.1:9", "broker": ["host": "127.0.0.1", "port": 9]]],
        ["name": "gtm", "exec": "pylon-gtm", "config": ["backend": "http://127.0.0.1:9"]],
    ])
    guard let hostPid = hostProcess?.pid else { fatalError("no host") }
    let status = try SyncClient(path: socketPath).call("bus.status", nil, timeoutMs: 5000)
    var pids: [(String, Int32)] = [("pylond", hostPid)]
    for p in status["plugins"]?.arrayValue ?? [] {
        if let name = p["name"]?.stringValue, let pid = p["pid"]?.intValue { pids.append(("pylon-" + name, Int32(pid))) }
    }
    usleep(2_000_000)  // let start-up work finish
    let before = pids.map { contextSwitches($0.1) }
    usleep(UInt32(duration * 1_000_000))
    let after = pids.map { contextSwitches($0.1) }
    print("idle wake-ups over \(Int(duration)) s (context switches per second):")
    for (i, (name, _)) in pids.enumerated() {
        let rate = Double(after[i] - before[i]) / duration
        print("  \(name): \((rate * 100).rounded() / 100)/s (\(after[i] - before[i]) in \(Int(duration)) s)")
    }
    stopHost()
}

/// Voluntary + involuntary context switches of `pid` so far.
func contextSwitches(_ pid: Int32) -> Int {
    guard let b = System.readFile("/proc/\(pid)/status") else { return 0 }
    var total = 0
    for line in String(decoding: b, as: UTF8.self).split(separator: "\n") {
        if line.hasPrefix("voluntary_ctxt_switches:") || line.hasPrefix("nonvoluntary_ctxt_switches:") {
            total += Int(line.split(separator: ":").last?.filter { $0 != " " && $0 != "\t" } ?? "") ?? 0
        }
    }
    return total
}
