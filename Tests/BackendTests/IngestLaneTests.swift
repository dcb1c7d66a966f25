import Foundation
import PylonClientKit
import TestSupport
import Testing

/// Sends never wait behind ingest (`IngestLane`): batches read from many devices queue in the
/// low-priority lane and run a slice per loop turn, while an admin send read after them is
/// answered at once — before the batches queued ahead of it are stored.
@Suite(.serialized) struct IngestLaneTests {
    /// Devices posting at once, and records per batch (work enough to still be queued when
    /// the send arrives).
    static let devices = 60
    static let recordsPerBatch = 2000

    @Test func anAdminSendIsAnsweredBeforeTheBatchesQueuedAheadOfIt() throws {
        let broker = try AnonymousBroker()
        let b = try BackendProcess(["--mqtt", "127.0.0.1:\(broker.port)"])
        try waitUntil(timeout: 10) {
            try b.request("POST", "/v1/admin/push/send", body: Array(#"{"appId":"x","targetType":"broadcast"}"#.utf8)).status == 200
        }
        let clients = try (0..<IngestLaneTests.devices).map { _ in try b.client() }
        // Every device sends at once (a thread each), so the backend reads them side by side.
        let sent = DispatchGroup()
        let failures = Failures()
        for (i, c) in clients.enumerated() {
            let key = "lane-\(i)"
            let body = batchBody(key: key, stream: "lane", ids: (0..<IngestLaneTests.recordsPerBatch).map { "r\(i)-\($0)" })
            let bytes = RawHTTPClient.message(
                "POST", "/v1/batches/lane", headers: [("Idempotency-Key", key)], body: Array(body.serialized.utf8))
            sent.enter()
            nonisolated(unsafe) let client = c  // used by this thread only until `sent` is done
            Thread {
                defer { sent.leave() }
                do { try client.send(bytes) } catch { failures.add("device \(i): \(error)") }
            }.start()
        }
        // Barrier: the backend has read most batches and still has some waiting.
        var lane: JSON = .null
        try waitUntil(timeout: 30) {
            lane = try b.get("/v1/inspect/stats")["ingestLane"] ?? .null
            return (lane["peakDepth"]?.intValue ?? 0) >= Int64(IngestLaneTests.devices / 2)
        }
        sent.wait()
        #expect(failures.all.isEmpty, "\(failures.all)")
        let send = try b.request(
            "POST", "/v1/admin/push/send", body: Array(#"{"appId":"x","targetType":"broadcast","title":"now"}"#.utf8))
        #expect(send.status == 200, "\(send.text)")
        let after = try b.get("/v1/inspect/stats")["ingestLane"] ?? .null
        #expect(
            (after["ran"]?.intValue ?? .max) < Int64(IngestLaneTests.devices),
            "the send was answered while batches read before it still waited: \(after)")
        // Every batch is then stored and answered, in full.
        for c in clients {
            let r = try c.readResponse(timeoutMs: 60_000)
            #expect(r?.status == 200, "\(r?.text ?? "closed")")
            #expect(try r?.json()["accepted"] == .int(Int64(IngestLaneTests.recordsPerBatch)))
        }
        #expect(try b.get("/v1/inspect/streams/lane")["records"] == .int(Int64(IngestLaneTests.devices * IngestLaneTests.recordsPerBatch)))
    }
}

/// Errors collected from several threads.
private final class Failures: @unchecked Sendable {
    private let lock = NSLock()
    private var list: [String] = []
    func add(_ s: String) { lock.withLock { list.append(s) } }
    var all: [String] { lock.withLock { list } }
}
