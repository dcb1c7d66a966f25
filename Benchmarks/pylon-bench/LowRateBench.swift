import PylonClientKit
import PylonHTTP
import PylonMQTT

#if canImport(Glibc)
import Glibc
#endif

/// `pylon-bench lowrate push|gtm|gtm-container|ma|consent|uploader [--rate 10] [--seconds 30] [--warmup 0]`: one writer on
/// the device driven one call at a time at a fixed rate through a real `pylond`, counted the way
/// the harness's `lowrate.sh` counts (docs/BENCHMARKS.md "Device rate"). Per acknowledged call,
/// summed over the host and every plugin: bytes handed to storage (`write_bytes` of
/// `/proc/PID/io`), that divided by the call's payload, write syscalls (`syscw`: socket writes
/// count too) and CPU µs (`/proc/PID/task/*/schedstat`, all threads). The reference backend and
/// the broker are listed apart. The counters are read after a warm-up second and again one second
/// after the last call, so writes a commit timer defers are counted. `--warmup N` makes N calls
/// at the same rate before the first reading: what happens once (a stream's owner row, MA's
/// session start) is then left out, and the figures are the cost per call that goes on.
///
/// - `push`: a QoS 1 message published to the device's topic on a local mosquitto → the push
///   plugin's inbox → the app's callback, which acknowledges it; the next one when the ack is sent.
/// - `gtm`: `gtm.push` of an event carrying `gtm.lifetime` (the values persisted in `gtm.lifetime`).
/// - `gtm-container`: a saved container (`gtm.db`): each call publishes a new version of a
///   container at the backend (the backend's work is listed apart), then `gtm.refresh` and a
///   re-open that waits for the network load, so the new version is fetched and saved; the
///   payload is the container's text. `gtm.refresh` is accepted at most every 5 s, so the rate
///   is at most 0.18/s (`--rate 0.1 --seconds 60`: six fetches).
/// - `ma`: `ma.eventRecord` (MA's own state plus the uploader's queue).
/// - `consent`: `consent.set` of one switch, alternating granted and denied (every call a change).
/// - `uploader`: `uploader.enqueue` of one record (the standard the others are held to).
nonisolated(unsafe) var lowRate = 10.0
/// Calls made before the counters are first read (`--warmup`).
nonisolated(unsafe) var lowRateWarmup = 0
nonisolated(unsafe) var lowRateTarget = "uploader"
let lowRateTargets = ["push", "gtm", "gtm-container", "ma", "consent", "uploader"]

/// The MA event of `lowrate.sh`, byte for byte.
let lowRateEvent =
    #"{"appKey":"lowrate","eventName":"purchase","property":{"sku":"A-1","price":9.99,"session":"3f2a9c1e-7b4d-4e8a-9c21-5d6e7f8a9b0c"}}"#

struct ProcCounters {
    var writeBytes: Int64 = 0
    var syscw: Int64 = 0
    var cpuNs: Int64 = 0

    static func - (a: ProcCounters, b: ProcCounters) -> ProcCounters {
        ProcCounters(writeBytes: a.writeBytes - b.writeBytes, syscw: a.syscw - b.syscw, cpuNs: a.cpuNs - b.cpuNs)
    }
    static func + (a: ProcCounters, b: ProcCounters) -> ProcCounters {
        ProcCounters(writeBytes: a.writeBytes + b.writeBytes, syscw: a.syscw + b.syscw, cpuNs: a.cpuNs + b.cpuNs)
    }

    /// `/proc/PID/io` (write_bytes, syscw) and the run time of every thread of `pid`.
    static func read(_ pid: Int32) -> ProcCounters {
        var c = ProcCounters()
        if let b = System.readFile("/proc/\(pid)/io") {
            for l in String(decoding: b, as: UTF8.self).split(separator: "\n") {
                let kv = l.split(separator: ":")
                guard kv.count == 2, let v = Int64(kv[1].trimmingCharacters()) else { continue }
                if kv[0] == "write_bytes" { c.writeBytes = v }
                if kv[0] == "syscw" { c.syscw = v }
            }
        }
        if let d = opendir("/proc/\(pid)/task") {
            while let e = readdir(d) {
                let name = withUnsafeBytes(of: e.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
                guard name.first?.isNumber == true, let b = System.readFile("/proc/\(pid)/task/\(name)/schedstat") else { continue }
                c.cpuNs += Int64(String(decoding: b, as: UTF8.self).split(separator: " ").first ?? "") ?? 0
            }
            closedir(d)
        }
        return c
    }
}

/// Drives `one` (which returns when call `i` is acknowledged) at `lowRate` per second for
/// `seconds` and prints the counts per call of `measured` (summed) and of `apart` (each).
func lowRateRun(
    _ label: String, payload: Int, measured: [(String, Int32)], apart: [(String, Int32)], _ one: (Int) throws -> Void
) rethrows {
    usleep(1_000_000)
    let all = measured + apart
    /// Sleeps until call `n` of a run started at `t0` is due.
    func pace(_ t0: UInt64, _ n: Int) {
        let next = t0 + UInt64(Double(n) / lowRate * 1e9)
        let now = Loop.hrtimeNs
        if next > now { usleep(UInt32((next - now) / 1000)) }
    }
    let w0 = Loop.hrtimeNs
    for i in 0..<lowRateWarmup {
        try one(i)
        pace(w0, i + 1)
    }
    let c0 = all.map { ProcCounters.read($0.1) }
    let t0 = Loop.hrtimeNs
    var n = 0
    while Double(Loop.hrtimeNs - t0) / 1e9 < seconds {
        try one(lowRateWarmup + n)
        n += 1
        pace(t0, n)
    }
    usleep(1_000_000)
    let d = zip(all, c0).map { p, c in ProcCounters.read(p.1) - c }
    let sum = d.prefix(measured.count).reduce(ProcCounters(), +)
    let per = { (v: Int64) in Double(v) / Double(max(n, 1)) }
    var line =
        "ROW \(label) rate=\(fmt(lowRate)) warmup=\(lowRateWarmup) events=\(n) payload=\(payload) write_bytes=\(Int(per(sum.writeBytes).rounded()))"
        + " amp=\(fmt2(per(sum.writeBytes) / Double(max(payload, 1)))) syscw=\(fmt2(per(sum.syscw))) cpu_us=\(fmt(per(sum.cpuNs) / 1000))"
    for (p, c) in zip(all, d) {
        line += " \(p.0)_bytes=\(Int(per(c.writeBytes).rounded())) \(p.0)_cpu_us=\(fmt(per(c.cpuNs) / 1000))"
    }
    print(line)
}

func fmt2(_ d: Double) -> String { String((d * 100).rounded() / 100) }

/// The host and every plugin, from `bus.status`.
func serverPids(_ sync: SyncClient) throws -> [(String, Int32)] {
    let status = try sync.call("bus.status")
    var pids: [(String, Int32)] = [("host", Int32(status["pid"]?.intValue ?? 0))]
    for p in status["plugins"]?.arrayValue ?? [] {
        pids.append((p["name"]?.stringValue ?? "?", Int32(p["pid"]?.intValue ?? 0)))
    }
    return pids
}

func lowRateBench() throws {
    switch lowRateTarget {
    case "push": try lowRatePush()
    case "gtm": try lowRateGTM()
    case "gtm-container": try lowRateGTMContainer()
    case "consent": try lowRateConsent()
    case "ma": try lowRateMA()
    default: try lowRateUploader()
    }
}

private func uploaderPlugin(_ port: Int) -> JSON {
    [
        "name": "uploader", "exec": "pylon-uploader",
        "config": [
            "endpoint": .string("http://127.0.0.1:\(port)/v1/batches/{stream}"), "credentialFile": .string(benchCredentialFile),
            "streams": ["ma.*": ["maxCount": 50, "intervalMs": 10000], "lowrate": ["maxCount": 50, "intervalMs": 10000]],
            "fsync": .string(fsyncMode),
        ],
    ]  // as lowrate.sh (`--fsync full` for the other setting)
}

func lowRateUploader() throws {
    let (backend, port) = try startBackend()
    startHost(plugins: [uploaderPlugin(port)])
    let sync = try SyncClient(path: socketPath)
    let data = try JSON.parse(lowRateEvent)
    try lowRateRun("uploader", payload: lowRateEvent.utf8.count, measured: try serverPids(sync), apart: [("backend", backend.pid)]) {
        _ = try sync.call("uploader.enqueue", ["stream": "lowrate", "records": [["id": .string("r\($0)"), "data": data]]])
    }
    backend.kill(SIGTERM)
    stopHost()
}

func lowRateMA() throws {
    let (backend, port) = try startBackend()
    startHost(plugins: [
        uploaderPlugin(port),
        [
            "name": "ma", "exec": "pylon-ma",
            "config": ["backend": .string("http://127.0.0.1:\(port)"), "credentialFile": .string(benchCredentialFile)],
        ],
    ])
    let sync = try SyncClient(path: socketPath)
    let started = try sync.call("ma.start", ["appKey": "lowrate"])
    guard started["code"]?.intValue == 0 else { fatalError("ma.start: \(started.serialized)") }
    let ev = try JSON.parse(lowRateEvent)
    try lowRateRun("ma", payload: lowRateEvent.utf8.count, measured: try serverPids(sync), apart: [("backend", backend.pid)]) { _ in
        let r = try sync.call("ma.eventRecord", ev)
        guard r["code"]?.intValue == 0 else { fatalError("ma.eventRecord: \(r.serialized)") }
    }
    backend.kill(SIGTERM)
    stopHost()
}

func lowRateGTM() throws {
    let defaults = tmp + "/gtm-defaults"
    _ = System.makeDirectories(defaults)
    _ = System.writeFileAtomically(defaults + "/GTM-BENCH", Array(gtmRulesContainer(10).utf8))
    startHost(plugins: [
        [
            "name": "gtm", "exec": "pylon-gtm",
            "config": ["defaultsDir": .string(defaults), "backend": "http://127.0.0.1:9", "logLevel": "error"],
        ]
    ])
    let sync = try SyncClient(path: socketPath)
    _ = try sync.call("gtm.openContainer", ["containerId": "GTM-BENCH", "openType": "default"])
    // The MA event's fields as a data-layer push, kept for a day.
    let data: JSON = [
        "event": "purchase", "sku": "A-1", "price": 9.99, "session": "3f2a9c1e-7b4d-4e8a-9c21-5d6e7f8a9b0c", "gtm.lifetime": "1d",
    ]
    let params: JSON = ["data": data]
    try lowRateRun("gtm", payload: params.serialized.utf8.count, measured: try serverPids(sync), apart: []) { _ in
        _ = try sync.call("gtm.push", params)
    }
    stopHost()
}

func lowRateGTMContainer() throws {
    guard lowRate <= 0.18 else {
        print("pylon-bench lowrate gtm-container: --rate at most 0.18 (gtm.refresh is accepted every 5 s at most)")
        exit(2)
    }
    let (backend, port) = try startBackend()
    let http = HTTPClient(loop: loop)
    let container = try JSON.parse(gtmRulesContainer(40))
    let body = Array(JSON.object(["container": container]).serialized.utf8)
    var published = ""
    func publish() {
        let url = "http://127.0.0.1:\(port)/v1/admin/gtm/containers/GTM-SAVED/versions"
        http.send(HTTPRequest(method: "POST", url: url, headers: [("Content-Type", "application/json"), benchOperatorHeader], body: body)) {
            r in
            guard case .success(let resp) = r, resp.status == 200, let v = (try? JSON.parse(resp.bodyText))?["version"]?.stringValue else {
                fatalError("publish: \(r)")
            }
            published = v
            loop.stop()
        }
        loop.run()
    }
    publish()
    startHost(plugins: [
        [
            "name": "gtm", "exec": "pylon-gtm",
            "config": [
                "backend": .string("http://127.0.0.1:\(port)"), "credentialFile": .string(benchCredentialFile), "logLevel": "error",
            ],
        ]
    ])
    let sync = try SyncClient(path: socketPath)
    let open: JSON = ["containerId": "GTM-SAVED", "openType": "prefer_fresh", "timeoutMs": 10_000]
    guard try sync.call("gtm.openContainer", open)["version"]?.stringValue == published else { fatalError("first open") }
    try lowRateRun("gtm-container", payload: body.count, measured: try serverPids(sync), apart: [("backend", backend.pid)]) { _ in
        publish()
        let r = try sync.call("gtm.refresh", ["containerId": "GTM-SAVED"])
        guard r["accepted"]?.boolValue == true else { fatalError("gtm.refresh: \(r.serialized)") }
        let o = try sync.call("gtm.openContainer", open)
        guard o["version"]?.stringValue == published else { fatalError("gtm.openContainer: \(o.serialized), want \(published)") }
    }
    http.shutdown()
    backend.kill(SIGTERM)
    stopHost()
}

func lowRateConsent() throws {
    startHost(plugins: [["name": "echo", "exec": "pylon-echo"]])
    let sync = try SyncClient(path: socketPath)
    let on: JSON = ["key": "lowrate:analytics", "granted": true]
    let off: JSON = ["key": "lowrate:analytics", "granted": false]
    try lowRateRun("consent", payload: on.serialized.utf8.count, measured: try serverPids(sync), apart: []) {
        _ = try sync.call("consent.set", $0 % 2 == 0 ? off : on)
    }
    stopHost()
}

func lowRatePush() throws {
    _ = System.makeDirectories(tmp)
    let mqttPort = freeLoopbackPort()
    let conf =
        "listener \(mqttPort) 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location \(tmp)/\nset_tcp_nodelay true\n"
        + (getuid() == 0 ? "user root\n" : "")
    _ = System.writeFileAtomically(tmp + "/mosquitto.conf", Array(conf.utf8))
    var mo = ChildProcess.Options(exec: "/usr/sbin/mosquitto")
    mo.args = ["-c", tmp + "/mosquitto.conf"]
    mo.detached = false
    let broker = try ChildProcess(loop: loop, options: mo) { _, _ in }
    usleep(300_000)
    let (backend, port) = try startBackend(["--mqtt", "127.0.0.1:\(mqttPort)"])
    startHost(plugins: [
        uploaderPlugin(port),
        [
            "name": "push", "exec": "pylon-push",
            "config": [
                "backend": .string("http://127.0.0.1:\(port)"), "credentialFile": .string(benchCredentialFile),
                "broker": ["host": "127.0.0.1", "port": .int(Int64(mqttPort)), "keepaliveS": 60],
            ],
        ],
    ])
    let sync = try SyncClient(path: socketPath)
    var deviceId = ""
    for _ in 0..<500 {
        let s = try sync.call("push.status")
        if let d = s["deviceId"]?.stringValue, s["connection"]?.stringValue == "connected" { deviceId = d; break }
        usleep(10_000)
    }
    guard !deviceId.isEmpty else { fatalError("push did not register") }

    // The app: serves bench.onPush and acknowledges every message at once.
    let app = try Connection.connect(loop: loop, path: socketPath, maxLineBytes: 1 << 20)
    var callbacks = 0
    let marker = Array(#""method":"bench.onPush""#.utf8)
    app.onLine = { l in
        guard find(l, marker) != nil, let r = find(l, Array(#""id":"#.utf8)) else { return }
        var i = r, v = 0
        while i < l.count, l[i] >= 0x30, l[i] <= 0x39 { v = v * 10 + Int(l[i] - 0x30); i += 1 }
        app.sendLine(#"{"jsonrpc":"2.0","id":\#(v),"result":{}}"#)
        loop.flushDirty()
        callbacks += 1
        loop.stop()
    }
    app.startReading()
    app.sendLine(#"{"jsonrpc":"2.0","id":"p","method":"bus.provide","params":{"method":"bench.onPush"}}"#)
    app.sendLine(#"{"jsonrpc":"2.0","id":"a","method":"push.attach","params":{"appId":"bench","callback":"bench.onPush"}}"#)
    loop.flushDirty()
    usleep(200_000)
    loop.runNoWait()

    var mopt = MQTTOptions(clientId: "bench-publisher")
    mopt.port = Int32(mqttPort)
    mopt.cleanSession = true
    let pub = MQTTClient(loop: loop, options: mopt)
    pub.onConnect = { _ in loop.stop() }
    pub.start()
    loop.run()
    let topic = "pylon/push/d/" + deviceId
    func message(_ i: Int) -> String {
        #"{"id":"m\#(i)","appId":"bench","title":"Sale","content":"20% off today","extras":{"campaign":"c-1"},"action":{"type":"url","value":"https://example.com/sale"},"silent":false}"#
    }
    let measured = try serverPids(sync)
    lowRateRun("push", payload: message(100).utf8.count, measured: measured, apart: [("backend", backend.pid), ("broker", broker.pid)]) {
        let before = callbacks
        pub.publish(topic, Array(message($0).utf8), qos: 1) { _ in }
        while callbacks == before { loop.run() }
    }
    pub.stop()
    app.close()
    loop.runNoWait()
    backend.kill(SIGTERM)
    broker.kill(SIGKILL)
    stopHost()
}
