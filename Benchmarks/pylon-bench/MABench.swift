import PylonClientKit

#if canImport(Glibc)
import Glibc
#endif

/// `pylon-bench ma`: acknowledged `ma.eventRecord` per second through the host (pipelined,
/// `--window` in flight; each event is validated, stamped and made durable by the uploader), and the
/// latency of one event on an idle system.
/// Events in flight (`--window N`, default 1024).
nonisolated(unsafe) var maWindow = 1024

func maBench() throws {
    let (backend, port) = try startBackend()
    startHost(plugins: [
        [
            "name": "uploader", "exec": "pylon-uploader",
            "config": [
                "endpoint": .string("http://127.0.0.1:\(port)/v1/batches/{stream}"), "maxDiskBytes": .int(1 << 30),
                "streams": ["ma.*": ["maxCount": 50, "intervalMs": 10000]], "credentialFile": .string(benchCredentialFile),
            ],
        ],  // as etc/pylon.json
        [
            "name": "ma", "exec": "pylon-ma",
            "config": ["backend": .string("http://127.0.0.1:\(port)"), "credentialFile": .string(benchCredentialFile)],
        ],
    ])
    let sync = try SyncClient(path: socketPath)
    _ = try sync.call("ma.start", ["appKey": "bench"])
    // One event at a time first: the latency of a single acknowledged event.
    var single: [UInt64] = []
    for _ in 0..<200 {
        let t0 = Loop.hrtimeNs
        _ = try sync.call("ma.eventRecord", ["appKey": "bench", "eventName": "tap", "property": ["screen": "home"]])
        single.append(Loop.hrtimeNs - t0)
    }
    single.sort()
    print("ma.eventRecord, one at a time: p50 \(fmt(percentile(single, 0.5))) µs, p99 \(fmt(percentile(single, 0.99))) µs")

    // CPU time of every process on the path (this client included), per acknowledged event.
    let status = try sync.call("bus.status")
    var pids: [(String, Int32)] = [("host", Int32(status["pid"]?.intValue ?? 0))]
    for p in status["plugins"]?.arrayValue ?? [] {
        pids.append((p["name"]?.stringValue ?? "?", Int32(p["pid"]?.intValue ?? 0)))
    }
    pids += [("backend", backend.pid), ("client", getpid())]
    let cpu0 = pids.map { cpuTicks($0.1) }
    let served0 = try servedByPlugin(sync)

    let conn = try Connection.connect(loop: loop, path: socketPath, maxLineBytes: 1 << 20)
    var sent = 0, acked = 0, errors = 0
    let start = Loop.hrtimeNs
    let deadline = start + UInt64(seconds * 1e9)
    let line =
        #"{"jsonrpc":"2.0","id":1,"method":"ma.eventRecord","params":{"appKey":"bench","eventName":"purchase","property":{"sku":"SKU-1","price":1999,"currency":"EUR","screen":"checkout"}}}"#
    func sendOne() { sent += 1; conn.sendLine(line) }
    conn.onLine = { l in
        if find(l, Array(#""code":0"#.utf8)) != nil { acked += 1 } else { errors += 1 }
        if Loop.hrtimeNs < deadline { sendOne() } else if acked + errors == sent { loop.stop() }
    }
    conn.startReading()
    for _ in 0..<maWindow { sendOne() }
    loop.flushDirty()
    loop.run()
    let secs = Double(Loop.hrtimeNs - start) / 1e9
    print("ma.eventRecord, \(maWindow) in flight: \(Int(Double(acked) / secs)) acknowledged events/s over \(fmt(secs)) s, errors \(errors)")
    let tick = 1e6 / Double(sysconf(Int32(_SC_CLK_TCK))) / Double(max(acked, 1))
    let cpu = zip(pids, cpu0).map { p, c0 in "\(p.0) \(fmt((cpuTicks(p.1) - c0) * tick))" }
    print("CPU µs per event: " + cpu.joined(separator: ", "))
    // Events per uploader.enqueue: requests the host routed to each plugin (MA's are the events,
    // the uploader's its enqueues; the few other calls are noise).
    let served1 = try servedByPlugin(sync)
    let events = (served1["ma"] ?? 0) - (served0["ma"] ?? 0)
    let enqueues = (served1["uploader"] ?? 0) - (served0["uploader"] ?? 0)
    print("events per uploader.enqueue: \(fmt(Double(events) / Double(max(enqueues, 1)))) (\(events) events, \(enqueues) enqueues)")
    conn.close()
    // The backend first: stopHost runs the loop until every child has exited.
    backend.kill(SIGTERM)
    stopHost()
}

/// `requests_served` of each plugin, from `bus.status`.
func servedByPlugin(_ sync: SyncClient) throws -> [String: Int64] {
    var out: [String: Int64] = [:]
    for p in try sync.call("bus.status")["plugins"]?.arrayValue ?? [] {
        if let n = p["name"]?.stringValue { out[n] = p["requests_served"]?.intValue ?? 0 }
    }
    return out
}
