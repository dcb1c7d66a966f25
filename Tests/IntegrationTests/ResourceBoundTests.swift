import Foundation
import PylonClientKit
import TestSupport
import Testing

/// Bounded queues and fair service under hostile load (issue 11, items 8–10): what a peer can
/// make the host hold is bounded, backpressure reaches whoever fills a queue, and a connect
/// flood neither exhausts descriptors nor floods the log.
@Suite(.serialized) struct ResourceBoundTests {
    static let queueLimit = 65_536

    func clientEntry(_ h: TestHost, _ pid: Int32? = nil) throws -> [JSON] {
        try h.status()["clients"]?.arrayValue ?? []
    }

    /// One client writes thousands of `bus.status` requests in one go and reads nothing: the
    /// host stops dispatching its input once its replies exceed the output bound, so what it
    /// holds for that client stays near `maxQueuedBytes`; another client is served meanwhile,
    /// and every request is answered once the flooder reads.
    @Test func hostRepliesAreBoundedByTheConnectionsOutputLimit() throws {
        let h = try TestHost(extra: ["limits": ["maxQueuedBytes": .int(Int64(Self.queueLimit))]])
        let flood = try h.client()
        let n = 5000
        var batch = ""
        for i in 0..<n { batch += #"{"jsonrpc":"2.0","id":\#(i),"method":"bus.status"}"# + "\n" }
        let bytes = Array(batch.utf8)
        let fd = flood.fd
        let writer = Thread { writeAll(fd, bytes) }
        writer.start()
        // The host has stopped reading the flooder (its replies reached the bound); then samples,
        // each behind another client's round trip.
        try waitUntil(timeout: 30) { try clientEntry(h).contains { $0["backpressured"] == .bool(true) } }
        var worst = 0
        for _ in 0..<10 {
            let me = try h.client()
            #expect(try me.call("bus.ping", nil, timeoutMs: 5000)["pong"] == .bool(true))
            let queued = try clientEntry(h).map { Int($0["queued_bytes"]?.intValue ?? 0) }.max() ?? 0
            worst = max(worst, queued)
        }
        // One status reply past the bound at most (each is a few KiB).
        #expect(worst <= Self.queueLimit + 32_768, "queued \(worst) bytes for a client that does not read")
        var answered = 0
        while answered < n, let m = try flood.readMessage(timeoutMs: 10_000) {
            if m["result"] != nil { answered += 1 }
        }
        #expect(answered == n, "every request answered once the client reads")
    }

    /// Many connections of one uid that subscribe and never read cannot hold `maxQueuedBytes`
    /// each: together they hold at most `maxQueuedBytesPerUid` (plus one publication), and
    /// the rest is dropped and counted.
    @Test func whatOneUidHasQueuedIsBoundedInTotal() throws {
        let perConnection = 262_144
        let perUid = 524_288
        let h = try TestHost(
            extra: ["limits": ["maxQueuedBytes": .int(Int64(perConnection)), "maxQueuedBytesPerUid": .int(Int64(perUid))]])
        var sleepers: [SyncClient] = []
        for _ in 0..<12 {
            let c = try h.client()
            _ = try c.call("bus.subscribe", ["pattern": "flood.*"])
            sleepers.append(c)
        }
        let pub = try h.client()
        let big: JSON = ["s": .string(String(repeating: "x", count: 16_384))]
        for _ in 0..<400 { _ = try pub.call("bus.publish", ["topic": "flood.x", "data": big]) }
        let status = try h.status()
        let queued = (status["clients"]?.arrayValue ?? []).reduce(0) { $0 + Int($1["queued_bytes"]?.intValue ?? 0) }
        #expect(queued <= perUid + 20_000, "one uid holds \(queued) bytes")
        #expect((status["counters"]?["dropped_for_uid_queue"]?.intValue ?? 0) > 0)
        // The uid's connections that read are still served.
        #expect(try pub.call("bus.ping")["pong"] == .bool(true))
        _ = sleepers
    }

    /// Clients sending to a plugin that cannot keep up are held while its queue is over the
    /// bound (the host's memory stays bounded), and a plugin that is busy — answering, just
    /// slowly — is not taken for hung although its heartbeat waits behind the queue.
    @Test func backpressureReachesTheClientsFillingAPluginsQueue() throws {
        let h = try TestHost(
            plugins: [
                [
                    "name": "py", "exec": .string(fixturesDir + "/fake_echo.py"),
                    "heartbeatIntervalMs": 100, "heartbeatTimeoutMs": 400,
                ]
            ], extra: ["limits": ["maxQueuedBytes": .int(Int64(Self.queueLimit))]])
        try h.waitForPlugin("py")
        let n = 40
        let pad = String(repeating: "x", count: 40_000)
        var lines = ""
        for i in 0..<n {
            lines += #"{"jsonrpc":"2.0","id":\#(i),"method":"py.slowecho","params":{"delay":0.1,"pad":"\#(pad)"}}"# + "\n"
        }
        let senders = try (0..<2).map { _ in try h.client() }
        let bytes = Array(lines.utf8)
        let threads = senders.map { c in
            let fd = c.fd
            return Thread { writeAll(fd, bytes) }
        }
        threads.forEach { $0.start() }
        var worstPlugin = 0
        var sawHeld = false
        // Samples from the moment the plugin's queue holds the senders.
        try waitUntil(timeout: 30) { try clientEntry(h).contains { $0["held"] == .bool(true) } }
        for _ in 0..<20 {
            let s = try h.status()
            let plugin = s["plugins"]?.arrayValue?.first { $0["name"] == .string("py") }
            worstPlugin = max(worstPlugin, Int(plugin?["queued_bytes"]?.intValue ?? 0))
            sawHeld = sawHeld || (s["clients"]?.arrayValue ?? []).contains { $0["held"] == .bool(true) }
        }
        // The bound: maxQueuedBytes plus the one message that crossed it, whoever sent it.
        #expect(worstPlugin <= Self.queueLimit + 45_000, "queued \(worstPlugin) bytes for the plugin")
        #expect(sawHeld, "the senders were held")
        for c in senders {
            var answered = 0
            while answered < n, let m = try c.readMessage(timeoutMs: 20_000) {
                if m["result"]?["ok"] != .bool(true) { Issue.record("\(m.serialized.prefix(300))"); break }
                answered += 1
            }
            #expect(answered == n)
        }
        #expect(try h.plugin("py")["restarts"] == .int(0), "a busy plugin is not killed as hung")
    }

    /// Past the connection limits a connection gets one error line and is closed at once;
    /// refusals are summed in the log rather than logged one by one; one uid cannot take every
    /// slot; the host keeps serving.
    @Test func aConnectFloodIsRefusedCheaplyAndFairly() throws {
        let h = try TestHost.open(extra: ["limits": ["maxConnections": 40, "maxConnectionsPerUid": 30]])
        let keeper = try h.client()
        var held: [SyncClient] = []
        var refused = 0
        for _ in 0..<300 {
            guard let c = try? h.client() else { continue }
            // A held connection answers the ping; a refused one has its error line and is closed
            // (no short timeout decides which).
            try? c.sendLine(#"{"jsonrpc":"2.0","id":1,"method":"bus.ping"}"#)
            let m = try? c.readMessage(timeoutMs: 10_000)
            if m?.errorCode == -32004 {
                refused += 1
            } else if m?["result"]?["pong"] == .bool(true) {
                held.append(c)
            } else {
                Issue.record("neither answered nor refused: \(m?.serialized ?? "nothing")")
            }
        }
        #expect(held.count == 29, "root's 30 connections: the keeper and 29 more")
        #expect(refused == 300 - 29)
        // Another uid still has room.
        let other = try h.runAs([#"{"jsonrpc":"2.0","id":1,"method":"bus.ping"}"#])
        #expect(other.replies.first?["result"]?["pong"] == .bool(true), "\(other.replies)")
        #expect(try keeper.call("bus.ping")["pong"] == .bool(true))
        held.removeAll()  // root's slots free again for the checks below
        // The host has closed them: only the keeper and the asking client are left.
        try waitUntil(timeout: 10) { (try keeper.call("bus.status")["clients_total"]?.intValue ?? 0) == 1 }
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(h.pid)/fd").count) ?? 0
        #expect(fds < 40 + 30, "host descriptors: \(fds)")
        let refusalLines = h.logText.split(separator: "\n").filter { $0.contains("connections refused") }.count
        #expect(refusalLines <= 2, "\(refusalLines) refusal log lines for \(refused) refusals")
        #expect((try h.status()["counters"]?["connections_refused"]?.intValue ?? 0) == Int64(refused))
    }
}

/// Blocking write of all of `bytes` (from a thread: the host may hold the writer back for long).
private func writeAll(_ fd: Int32, _ bytes: [UInt8]) {
    var off = 0
    while off < bytes.count {
        let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }
        if n < 0 { if errno == EINTR { continue }; return }
        off += n
    }
}
