import PylonClientKit

#if canImport(Glibc)
import Glibc
#endif

/// pylon-bench: client → host → echo plugin → host → client round trips.
///
/// Starts its own `pylond` (from the same build directory) with the echo plugin on a temporary
/// socket, unless `--socket PATH` names a running host. Modes: sequential (1 in flight),
/// pipelined (64 in flight, 1 client), and 4 clients × 64. Reports msgs/s, p50/p99 latency and
/// the host's CPU time per message, plus idle RSS of the host and the plugin.
///
///     swift build -c release && .build/release/pylon-bench [--seconds 5] [--socket PATH]

struct Mode {
    let name: String
    let clients: Int
    let window: Int
}

nonisolated(unsafe) var seconds = 5.0
nonisolated(unsafe) var externalSocket: String?
nonisolated(unsafe) var benchMode = "bus"
nonisolated(unsafe) var fsyncMode = "normal"
nonisolated(unsafe) var secondsGiven = false
let lowRateUsage =
    "usage: pylon-bench lowrate \(lowRateTargets.joined(separator: "|")) [--rate N] [--seconds N] [--warmup N] [--fsync normal|full]"
var it = CommandLine.arguments.dropFirst().makeIterator()
while let a = it.next() {
    switch a {
    case "--seconds": seconds = Double(it.next() ?? "") ?? seconds; secondsGiven = true
    case "--socket": externalSocket = it.next()
    case "--fsync": fsyncMode = it.next() ?? "normal"
    case "--window": maWindow = Int(it.next() ?? "") ?? maWindow; gtmWindow = maWindow
    case "--rate": lowRate = Double(it.next() ?? "") ?? lowRate
    case "--warmup": lowRateWarmup = max(0, Int(it.next() ?? "") ?? 0)
    case "bus", "uploader", "ma", "idle", "push", "gtm": benchMode = a
    case "lowrate":
        benchMode = a
        if !secondsGiven { seconds = 30 }
        guard let t = it.next(), lowRateTargets.contains(t) else {
            print(lowRateUsage)
            exit(2)
        }
        lowRateTarget = t
    default:
        print(
            "usage: pylon-bench [bus|uploader|ma|idle|push|gtm] [--seconds N] [--window N] [--socket PATH] [--fsync normal|full]\n"
                + "       " + lowRateUsage.dropFirst("usage: ".count))
        exit(2)
    }
}

// The benchmark is single-threaded: everything runs on this one loop.
nonisolated(unsafe) let loop = Loop()
nonisolated(unsafe) var hostProcess: ChildProcess?
let tmp = "/tmp/pylon-bench-\(getpid())"
let socketPath = externalSocket ?? tmp + "/pylon.sock"

func startHost(plugins: [JSON]) {
    guard let dir = System.executableDirectory() else { fatalError("cannot find my directory") }
    _ = System.makeDirectories(tmp)
    let cfg: JSON = [
        "socket": .string(socketPath), "stateDir": .string(tmp + "/state"), "pluginDir": .string(dir),
        "logLevel": "warn",
        "limits": ["maxInflightPerConnection": 4096],
        "plugins": .array(plugins),
    ]
    let path = tmp + "/pylon.json"
    _ = System.writeFileAtomically(path, Array(cfg.serialized.utf8))
    var o = ChildProcess.Options(exec: dir + "/pylond")
    o.args = ["--config", path]
    // The config names the socket and state directory: drop overrides inherited from the caller
    // (the Makefile exports PYLON_SOCKET for `make run`).
    o.env = System.environment().filter { !$0.hasPrefix("PYLON_SOCKET=") && !$0.hasPrefix("PYLON_STATE_DIR=") }
    o.detached = false
    do {
        hostProcess = try ChildProcess(loop: loop, options: o) { status, sig in
            print("pylond exited: status \(status) signal \(sig)")
        }
    } catch {
        fatalError("cannot start pylond: \(error)")
    }
    // Wait for readiness.
    for _ in 0..<500 {
        if let c = try? SyncClient(path: socketPath), let s = try? c.call("bus.status", nil, timeoutMs: 1000),
            s["state"]?.stringValue == "running"
        {
            return
        }
        usleep(10_000)
    }
    fatalError("pylond did not become ready")
}

func stopHost() {
    if let p = hostProcess {
        p.kill(SIGTERM)
        loop.run()
        hostProcess = nil
    }
    _ = system("rm -rf " + tmp)
}

/// CPU time (user+system) of a process in clock ticks, from /proc/PID/stat.
func cpuTicks(_ pid: Int32) -> Double {
    guard let b = System.readFile("/proc/\(pid)/stat") else { return 0 }
    let s = String(decoding: b, as: UTF8.self)
    guard let close = s.lastIndex(of: ")") else { return 0 }
    let f = s[s.index(after: close)...].split(separator: " ")
    // Fields after the comm: state(0) ... utime(11) stime(12)
    return (Double(f[11]) ?? 0) + (Double(f[12]) ?? 0)
}

/// A ~200-byte request body; `ID` is replaced per request.
let paramsText = #"{"user":"u-4711","event":"button_click","screen":"home","props":{"x":12,"y":34,"label":"Start"},"ts":1764441600123}"#

final class Driver {
    let conn: Connection
    let window: Int
    var sent = 0
    var received = 0
    var sendTimes: [UInt64]
    var latencies: [UInt64] = []
    let deadline: UInt64
    var done = false
    let onDone: () -> Void

    init(window: Int, deadline: UInt64, capacity: Int, onDone: @escaping () -> Void) throws {
        conn = try Connection.connect(loop: loop, path: socketPath, maxLineBytes: 1 << 20)
        self.window = window
        self.deadline = deadline
        self.onDone = onDone
        sendTimes = [UInt64](repeating: 0, count: capacity)
        latencies.reserveCapacity(capacity)
        conn.onLine = { [unowned self] l in self.reply(l) }
    }

    func sendOne() {
        let id = sent
        sent += 1
        if id < sendTimes.count { sendTimes[id] = Loop.hrtimeNs }
        conn.sendLine(#"{"jsonrpc":"2.0","id":\#(id),"method":"echo.echo","params":"# + paramsText + "}")
    }

    func start() {
        conn.startReading()
        for _ in 0..<window { sendOne() }
        loop.flushDirty()
    }

    /// Finds `"id":N` without a full parse: the driver must cost the host as little CPU as possible.
    func reply(_ line: UnsafeRawBufferPointer) {
        var id = -1
        if let r = find(line, Array(#""id":"#.utf8)) {
            var v = 0
            var i = r
            while i < line.count, line[i] >= 0x30, line[i] <= 0x39 { v = v * 10 + Int(line[i] - 0x30); i += 1 }
            id = v
        }
        received += 1
        let now = Loop.hrtimeNs
        if id >= 0 && id < sendTimes.count { latencies.append(now - sendTimes[id]) }
        if now < deadline {
            sendOne()
        } else if received == sent && !done {
            done = true
            onDone()
        }
    }
}

func find(_ hay: UnsafeRawBufferPointer, _ needle: [UInt8]) -> Int? {
    guard hay.count >= needle.count else { return nil }
    var i = 0
    while i + needle.count <= hay.count {
        if hay[i] == needle[0] {
            var ok = true
            for j in 1..<needle.count where hay[i + j] != needle[j] { ok = false; break }
            if ok { return i + needle.count }
        }
        i += 1
    }
    return nil
}

func percentile(_ sorted: [UInt64], _ p: Double) -> Double {
    guard !sorted.isEmpty else { return 0 }
    let idx = min(sorted.count - 1, Int(Double(sorted.count) * p))
    return Double(sorted[idx]) / 1000.0
}

func run(_ mode: Mode, hostPid: Int32, pluginPid: Int32) {
    let start = Loop.hrtimeNs
    let deadline = start + UInt64(seconds * 1e9)
    var finished = 0
    let cpu0 = cpuTicks(hostPid)
    let pcpu0 = cpuTicks(pluginPid)
    let mcpu0 = cpuTicks(getpid())
    var drivers: [Driver] = []
    for _ in 0..<mode.clients {
        do {
            let d = try Driver(window: mode.window, deadline: deadline, capacity: 4_000_000) {
                finished += 1
                if finished == mode.clients { loop.stop() }
            }
            drivers.append(d)
        } catch {
            fatalError("connect: \(error)")
        }
    }
    for d in drivers { d.start() }
    loop.run()
    let elapsed = Double(Loop.hrtimeNs - start) / 1e9
    let cpu1 = cpuTicks(hostPid)
    let pcpu1 = cpuTicks(pluginPid)
    let mcpu1 = cpuTicks(getpid())
    let total = drivers.reduce(0) { $0 + $1.received }
    var lat = drivers.flatMap { $0.latencies }
    lat.sort()
    let ticksPerSec = Double(sysconf(Int32(_SC_CLK_TCK)))
    let cpuUsPerMsg = (cpu1 - cpu0) / ticksPerSec * 1e6 / Double(max(total, 1))
    let rate = Double(total) / elapsed
    let perMsg = { (a: Double, b: Double) in (b - a) / ticksPerSec * 1e6 / Double(max(total, 1)) }
    let line =
        "\(mode.name.padding(25)) \(String(Int(rate)).padding(8)) msgs/s  p50 \(fmt(percentile(lat, 0.5))) µs  p99 \(fmt(percentile(lat, 0.99))) µs  CPU µs/msg: host \(fmt(cpuUsPerMsg)), plugin \(fmt(perMsg(pcpu0, pcpu1))), client \(fmt(perMsg(mcpu0, mcpu1)))"
    print(line)
    for d in drivers { d.conn.close() }
    loop.runNoWait()
}

func fmt(_ d: Double) -> String {
    let r = (d * 10).rounded() / 10
    return String(r)
}

extension String {
    func padding(_ n: Int) -> String { count >= n ? self : self + String(repeating: " ", count: n - count) }
}

func busBench() throws {
    if externalSocket == nil { startHost(plugins: [["name": "echo", "exec": "pylon-echo"]]) }
    let status = try SyncClient(path: socketPath).call("bus.status")
    let hostPid = Int32(status["pid"]?.intValue ?? 0)
    let pluginPid = Int32(status["plugins"]?.arrayValue?.first?["pid"]?.intValue ?? 0)
    print(
        "pylond pid \(hostPid): idle RSS \(System.rssKiB(pid: hostPid) ?? 0) KiB; echo plugin pid \(pluginPid): idle RSS \(System.rssKiB(pid: pluginPid) ?? 0) KiB"
    )
    print(
        "request: \(#"{"jsonrpc":"2.0","id":N,"method":"echo.echo","params":"#.utf8.count + paramsText.utf8.count + 4) bytes; \(seconds) s per mode"
    )
    for mode in [
        Mode(name: "sequential (1 in flight)", clients: 1, window: 1),
        Mode(name: "pipelined (64 in flight)", clients: 1, window: 64),
        Mode(name: "4 clients x 64", clients: 4, window: 64),
    ] {
        run(mode, hostPid: hostPid, pluginPid: pluginPid)
    }
    print("after load: pylond RSS \(System.rssKiB(pid: hostPid) ?? 0) KiB; echo RSS \(System.rssKiB(pid: pluginPid) ?? 0) KiB")
    stopHost()
}

switch benchMode {
case "uploader": try uploaderBench()
case "ma": try maBench()
case "idle": try idleBench()
case "push": try pushBench()
case "gtm": try gtmBench()
case "lowrate": try lowRateBench()
default: try busBench()
}
