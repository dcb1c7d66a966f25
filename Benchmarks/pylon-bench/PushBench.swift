import PylonClientKit
import PylonHTTP
import PylonMQTT

#if canImport(Glibc)
import Glibc
#endif

/// `pylon-bench push`: backend send (HTTP admin API) → broker (QoS 1) → push plugin (SQLite inbox)
/// → host → the app's callback, which acknowledges at once. Reports the latency of one message
/// at a time (send to callback), sustained acknowledged messages per second to one attached app
/// (`--window` sends in flight, default 64), the plugin's idle RSS and its wake-ups while idle.
nonisolated(unsafe) var pushWindow = 64

func freeLoopbackPort() -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) { p in
        p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
    }
    return Int(UInt16(bigEndian: addr.sin_port))
}

/// Voluntary context switches of a process (each is a wake-up from a blocking wait).
func wakeups(_ pid: Int32) -> Int {
    guard let b = System.readFile("/proc/\(pid)/status") else { return 0 }
    for l in String(decoding: b, as: UTF8.self).split(separator: "\n") where l.hasPrefix("voluntary_ctxt_switches:") {
        return Int(l.split(separator: "\t").last?.trimmingCharacters() ?? "") ?? 0
    }
    return 0
}

extension Substring {
    func trimmingCharacters() -> String { String(self.filter { $0 != " " && $0 != "\t" }) }
}

func pushBench() throws {
    _ = System.makeDirectories(tmp)
    let mqttPort = freeLoopbackPort()
    let conf =
        "listener \(mqttPort) 127.0.0.1\nallow_anonymous true\npersistence true\npersistence_location \(tmp)/\nmax_queued_messages 100000\nset_tcp_nodelay true\n"
        + (getuid() == 0 ? "user root\n" : "")
    _ = System.writeFileAtomically(tmp + "/mosquitto.conf", Array(conf.utf8))
    var mo = ChildProcess.Options(exec: "/usr/sbin/mosquitto")
    mo.args = ["-c", tmp + "/mosquitto.conf"]
    mo.detached = false
    let broker = try ChildProcess(loop: loop, options: mo) { _, _ in }
    usleep(300_000)
    let (backend, port) = try startBackend(["--mqtt", "127.0.0.1:\(mqttPort)"])
    startHost(plugins: [
        [
            "name": "uploader", "exec": "pylon-uploader",
            "config": [
                "endpoint": .string("http://127.0.0.1:\(port)/v1/batches/{stream}"), "credentialFile": .string(benchCredentialFile),
            ],
        ],
        [
            "name": "push", "exec": "pylon-push",
            "config": [
                "backend": .string("http://127.0.0.1:\(port)"), "maxInFlightPerApp": 1024,
                "credentialFile": .string(benchCredentialFile),
                "broker": ["host": "127.0.0.1", "port": .int(Int64(mqttPort)), "keepaliveS": 60],
            ],
        ],
    ])
    let sync = try SyncClient(path: socketPath)
    var token = ""
    for _ in 0..<500 {
        let s = try sync.call("push.status")
        if let t = s["token"]?.stringValue, s["connection"]?.stringValue == "connected" { token = t; break }
        usleep(10_000)
    }
    guard !token.isEmpty else { fatalError("push did not register") }
    let status = try sync.call("bus.status")
    let pushPid = Int32(status["plugins"]?.arrayValue?.first { $0["name"]?.stringValue == "push" }?["pid"]?.intValue ?? 0)
    usleep(1_000_000)
    let w0 = wakeups(pushPid)
    usleep(5_000_000)
    let w1 = wakeups(pushPid)
    let upPid = Int32(status["plugins"]?.arrayValue?.first { $0["name"]?.stringValue == "uploader" }?["pid"]?.intValue ?? 0)
    print(
        "pylon-push pid \(pushPid): idle RSS \(System.rssKiB(pid: pushPid) ?? 0) KiB (uploader for comparison: \(System.rssKiB(pid: upPid) ?? 0) KiB); wake-ups in 5 s idle: \(w1 - w0) (host heartbeats included)"
    )

    // The app: serves bench.onPush and acknowledges every message at once.
    let app = try Connection.connect(loop: loop, path: socketPath, maxLineBytes: 1 << 20)
    var callbacks = 0
    var onCallback: () -> Void = {}
    let marker = Array(#""method":"bench.onPush""#.utf8)
    app.onLine = { l in
        guard find(l, marker) != nil, let r = find(l, Array(#""id":"#.utf8)) else { return }
        var i = r, v = 0
        while i < l.count, l[i] >= 0x30, l[i] <= 0x39 { v = v * 10 + Int(l[i] - 0x30); i += 1 }
        app.sendLine(#"{"jsonrpc":"2.0","id":\#(v),"result":{}}"#)
        callbacks += 1
        onCallback()
    }
    app.startReading()
    app.sendLine(#"{"jsonrpc":"2.0","id":"p","method":"bus.provide","params":{"method":"bench.onPush"}}"#)
    app.sendLine(#"{"jsonrpc":"2.0","id":"a","method":"push.attach","params":{"appId":"bench","callback":"bench.onPush"}}"#)
    loop.flushDirty()
    usleep(200_000)
    loop.runNoWait()

    let http = HTTPClient(loop: loop)
    let body = Array(
        #"{"appId":"bench","targetType":"device","target":"\#(token)","title":"Sale","content":"20% off today","extendedParams":{"campaign":"c-1"},"url":"https://example.com/sale"}"#
            .utf8)
    let url = "http://127.0.0.1:\(port)/v1/admin/push/send"
    var httpErrors = 0
    func send(_ done: @escaping () -> Void) {
        http.send(HTTPRequest(method: "POST", url: url, headers: [("Content-Type", "application/json"), benchOperatorHeader], body: body)) {
            r in
            if case .success(let resp) = r, resp.status == 200 {} else { httpErrors += 1 }
            done()
        }
    }

    // One at a time: send → callback.
    var lat: [UInt64] = []
    var t0: UInt64 = 0
    var replied = false, called = false
    func next() {
        guard lat.count < 500 else { loop.stop(); return }
        replied = false
        called = false
        t0 = Loop.hrtimeNs
        send {
            replied = true; if called { next() }
        }
    }
    onCallback = {
        lat.append(Loop.hrtimeNs - t0)
        called = true
        if replied { next() }
    }
    next()
    loop.run()
    lat.sort()
    print("push one at a time (send → app callback): p50 \(fmt(percentile(lat, 0.5))) µs, p99 \(fmt(percentile(lat, 0.99))) µs")

    // Sustained: `pushWindow` sends in flight for `seconds`.
    let pids: [(String, Int32)] = [
        ("host", Int32(status["pid"]?.intValue ?? 0)), ("push", pushPid), ("backend", backend.pid),
        ("broker", broker.pid), ("bench", getpid()),
    ]
    let cpu0 = pids.map { cpuTicks($0.1) }
    let startCallbacks = callbacks
    var sent = 0, answered = 0
    let start = Loop.hrtimeNs
    let deadline = start + UInt64(seconds * 1e9)
    var sending = true
    onCallback = {
        if !sending && callbacks - startCallbacks >= sent { loop.stop() }
    }
    func pump() {
        sent += 1
        send {
            answered += 1
            if Loop.hrtimeNs < deadline { pump() } else { sending = false }
        }
    }
    for _ in 0..<pushWindow { pump() }
    loop.run()
    let secs = Double(Loop.hrtimeNs - start) / 1e9
    let acked = callbacks - startCallbacks
    print(
        "push sustained, \(pushWindow) sends in flight: \(Int(Double(acked) / secs)) acknowledged msgs/s to one app over \(fmt(secs)) s (\(acked) of \(sent) sent, HTTP errors \(httpErrors))"
    )
    let tick = 1e6 / Double(sysconf(Int32(_SC_CLK_TCK))) / Double(max(acked, 1))
    print("CPU µs per message: " + zip(pids, cpu0).map { p, c0 in "\(p.0) \(fmt((cpuTicks(p.1) - c0) * tick))" }.joined(separator: ", "))

    // The device side alone: QoS 1 publishes straight to the device's topic (what the backend
    // does per device), `pushWindow` unacknowledged by the broker at a time.
    var mopt = MQTTOptions(clientId: "bench-publisher")
    mopt.port = Int32(mqttPort)
    mopt.cleanSession = true
    let pub = MQTTClient(loop: loop, options: mopt)
    pub.onConnect = { _ in loop.stop() }
    pub.start()
    loop.run()
    let dcpu0 = pids.map { cpuTicks($0.1) }
    let dStart = Loop.hrtimeNs
    let dDeadline = dStart + UInt64(seconds * 1e9)
    let dStartCallbacks = callbacks
    var published = 0
    sending = true
    onCallback = {
        if !sending && callbacks - dStartCallbacks >= published { loop.stop() }
    }
    let deviceId = (try? SyncClient(path: socketPath).call("push.status"))?["deviceId"]?.stringValue ?? ""
    let topic = "pylon/push/d/" + deviceId  // the device's topic is named by its device id
    func publishOne() {
        published += 1
        let m =
            #"{"id":"d\#(published)","appId":"bench","title":"Sale","content":"20% off today","extras":{"campaign":"c-1"},"action":{"type":"url","value":"https://example.com/sale"},"silent":false}"#
        pub.publish(topic, Array(m.utf8), qos: 1) { _ in
            if Loop.hrtimeNs < dDeadline { publishOne() } else { sending = false }
        }
    }
    for _ in 0..<pushWindow { publishOne() }
    loop.run()
    let dSecs = Double(Loop.hrtimeNs - dStart) / 1e9
    let dAcked = callbacks - dStartCallbacks
    print(
        "device side (broker → plugin → app ack), \(pushWindow) QoS 1 publishes in flight: \(Int(Double(dAcked) / dSecs)) acknowledged msgs/s over \(fmt(dSecs)) s (\(dAcked) of \(published))"
    )
    let dtick = 1e6 / Double(sysconf(Int32(_SC_CLK_TCK))) / Double(max(dAcked, 1))
    print("CPU µs per message: " + zip(pids, dcpu0).map { p, c0 in "\(p.0) \(fmt((cpuTicks(p.1) - c0) * dtick))" }.joined(separator: ", "))
    pub.stop()
    usleep(500_000)
    let s = try SyncClient(path: socketPath).call("push.status")
    print("plugin counters: \(s["counters"]?.serialized ?? "")")
    print("after load: pylon-push RSS \(System.rssKiB(pid: pushPid) ?? 0) KiB")
    app.close()
    http.shutdown()
    backend.kill(SIGTERM)
    broker.kill(SIGKILL)
    stopHost()
}
