import PylonClientKit
import PylonHTTP

#if canImport(Glibc)
import Glibc
#endif

/// The backend's secrets for the benches (docs/SECURITY.md, "Backend"): the plugins present
/// `benchCredentialFile`, the operator calls `benchOperatorHeader`.
let benchOperatorToken = "bench-operator-token-0123456789"
var benchCredentialFile: String { tmp + "/device.key" }
var benchOperatorHeader: (String, String) { ("Authorization", "Bearer " + benchOperatorToken) }

/// Starts `pylon-backend` on a free loopback port; returns it and the port it printed.
func startBackend(_ extraArgs: [String] = []) throws -> (ChildProcess, Int) {
    guard let dir = System.executableDirectory() else { fatalError("cannot find my directory") }
    _ = System.makeDirectories(tmp)
    for (f, v) in [("/operator.token", benchOperatorToken), ("/device.key", "bench-device-key-0123456789abcdef")] {
        _ = System.writeFileAtomically(tmp + f, Array(v.utf8))
        chmod(tmp + f, 0o600)
    }
    let out = Connection(loop: loop, maxLineBytes: 4096)
    var port = 0
    out.onLine = { line in
        let s = String(decoding: line, as: UTF8.self)
        if let p = s.split(separator: ":").last, let n = Int(p) { port = n; loop.stop() }
    }
    var o = ChildProcess.Options(exec: dir + "/pylon-backend")
    o.args =
        [
            "--listen", "127.0.0.1:0", "--db", tmp + "/backend.db", "--operator-token-file", tmp + "/operator.token",
            "--enrol-secret-file", benchCredentialFile,
        ] + extraArgs
    o.env = System.environment()
    o.stdout = out
    o.detached = false
    let backend = try ChildProcess(loop: loop, options: o) { _, _ in }
    out.startReading()
    loop.run()
    guard port > 0 else { fatalError("backend did not start") }
    return (backend, port)
}

/// `pylon-bench uploader`: acknowledged durable enqueues per second through the host
/// (~300-byte records, `--window` requests in flight, default 1,024, one record per request), then end-to-end
/// records per second delivered to the reference backend.
func uploaderBench() throws {
    let (backend, port) = try startBackend()
    let stream = "bench.events"
    startHost(plugins: [
        [
            "name": "uploader", "exec": "pylon-uploader",
            "config": [
                "endpoint": .string("http://127.0.0.1:\(port)/v1/batches/{stream}"), "fsync": .string(fsyncMode),
                "credentialFile": .string(benchCredentialFile),
                "maxDiskBytes": .int(1 << 30),
                "streams": ["bench.*": ["maxCount": 500, "intervalMs": 1000, "maxBatchBytes": 1_048_576]],
            ],
        ]
    ])
    let status = try SyncClient(path: socketPath).call("bus.status")
    let hostPid = Int32(status["pid"]?.intValue ?? 0)
    let pluginPid = Int32(status["plugins"]?.arrayValue?.first?["pid"]?.intValue ?? 0)

    let payload =
        #","data":{"event":"purchase","screen":"checkout","sku":"SKU-000123","price":1999,"currency":"EUR","props":{"campaign":"winter","variant":"b","session":"s-42"},"device":{"os":"linux","model":"kiosk-3"}}}]}}"#
    let conn = try Connection.connect(loop: loop, path: socketPath, maxLineBytes: 1 << 20)
    var sent = 0
    var acked = 0
    var errors = 0
    let window = maWindow
    let start = Loop.hrtimeNs
    let deadline = start + UInt64(seconds * 1e9)
    var sendTimes = [UInt64](repeating: 0, count: 4_000_000)
    var lat: [UInt64] = []
    lat.reserveCapacity(1_000_000)
    func sendOne() {
        let i = sent
        sent += 1
        if i < sendTimes.count { sendTimes[i] = Loop.hrtimeNs }
        conn.sendLine(
            #"{"jsonrpc":"2.0","id":\#(i),"method":"uploader.enqueue","params":{"stream":"\#(stream)","consent":"bench:events","records":[{"id":"r\#(i)""#
                + payload)
    }
    let cpu0 = cpuTicks(hostPid), pcpu0 = cpuTicks(pluginPid), bcpu0 = cpuTicks(backend.pid)
    conn.onLine = { line in
        if find(line, Array(#""accepted""#.utf8)) != nil { acked += 1 } else { errors += 1 }
        if let r = find(line, Array(#""id":"#.utf8)) {
            var v = 0
            var k = r
            while k < line.count, line[k] >= 0x30, line[k] <= 0x39 { v = v * 10 + Int(line[k] - 0x30); k += 1 }
            if v < sendTimes.count { lat.append(Loop.hrtimeNs - sendTimes[v]) }
        }
        if Loop.hrtimeNs < deadline { sendOne() } else if acked + errors == sent { loop.stop() }
    }
    conn.startReading()
    for _ in 0..<window { sendOne() }
    loop.flushDirty()
    loop.run()
    let ackSeconds = Double(Loop.hrtimeNs - start) / 1e9
    let cpu1 = cpuTicks(hostPid), pcpu1 = cpuTicks(pluginPid)
    lat.sort()
    let tps = Double(sysconf(Int32(_SC_CLK_TCK)))
    print(
        "uploader.enqueue (fsync \(fsyncMode)): \(Int(Double(acked) / ackSeconds)) acknowledged records/s over \(fmt(ackSeconds)) s, "
            + "p50 \(fmt(percentile(lat, 0.5))) µs, p99 \(fmt(percentile(lat, 0.99))) µs, errors \(errors); "
            + "CPU µs/record: host \(fmt((cpu1 - cpu0) / tps * 1e6 / Double(max(acked, 1)))), uploader \(fmt((pcpu1 - pcpu0) / tps * 1e6 / Double(max(acked, 1))))"
    )

    let statusClient = try SyncClient(path: socketPath)
    let commits = (try? statusClient.call("uploader.status"))?["commits"]?.intValue ?? 0
    print("group commits: \(commits), \(fmt(Double(acked) / Double(max(commits, 1)))) records per commit")

    // End to end: until the uploader has had every acknowledged record accepted by the backend
    // (its `delivered` count; asking the backend every few milliseconds would charge the
    // backend a count over its whole index each time), then the backend's own count confirms it.
    func deliveredByUploader() -> Int {
        Int((try? statusClient.call("uploader.status"))?["streams"]?[stream]?["delivered"]?.intValue ?? 0)
    }
    // What was delivered while the enqueues went on; the rest drains alone (the drain's own rate).
    let deliveredAtAckEnd = deliveredByUploader()
    let ackEnd = Loop.hrtimeNs
    while deliveredByUploader() < acked && Loop.hrtimeNs - start <= UInt64(120e9) { usleep(5_000) }
    let e2eEnd = Loop.hrtimeNs
    let bcpu1 = cpuTicks(backend.pid)
    let http = HTTPClient(loop: loop)
    var delivered = 0
    http.send(HTTPRequest(url: "http://127.0.0.1:\(port)/v1/inspect/streams/\(stream)", headers: [benchOperatorHeader])) { r in
        if case .success(let resp) = r, let j = try? JSON.parse(resp.bodyText) { delivered = Int(j["records"]?.intValue ?? 0) }
        loop.stop()
    }
    loop.run()
    let e2e = Double(e2eEnd - start) / 1e9
    let backendUs = (bcpu1 - bcpu0) / tps * 1e6 / Double(max(delivered, 1))
    print(
        "end to end: \(delivered) of \(acked) records at the backend after \(fmt(e2e)) s = \(Int(Double(delivered) / e2e)) records/s; "
            + "CPU µs/record: backend \(fmt(backendUs)); "
            + "\(deliveredAtAckEnd) delivered while enqueuing, the remaining \(acked - deliveredAtAckEnd) drained alone at "
            + "\(Int(Double(acked - deliveredAtAckEnd) / max(Double(e2eEnd - ackEnd) / 1e9, 1e-9))) records/s")
    http.shutdown()
    conn.close()
    // The backend first: stopHost runs the loop until every child has exited.
    backend.kill(SIGTERM)
    stopHost()
}
