import Foundation
import PylonClientKit
import TestSupport
import Testing

/// Sends never wait behind ingest (`IngestLane`): batches read from many devices queue in the
/// low-priority lane, while an admin send read after them is answered at once — before the
/// batches queued ahead of it are stored. The `holdIngest` fault keeps the lane from running
/// (a store that cannot keep up), so what waits and what does not is seen without timing.
@Suite(.serialized) struct IngestLaneTests {
    static let devices = 60
    static let recordsPerBatch = 200

    @Test func anAdminSendIsAnsweredWhileTheBatchesReadBeforeItWait() throws {
        let broker = try AnonymousBroker()
        let b = try BackendProcess(["--mqtt", "127.0.0.1:\(broker.port)"])
        try waitUntil(timeout: 10) {
            try b.request("POST", "/v1/admin/push/send", body: Array(#"{"appId":"x","targetType":"broadcast"}"#.utf8)).status == 200
        }
        try b.setFaults(["holdIngest": true])
        let clients = try (0..<IngestLaneTests.devices).map { _ in try b.client() }
        for (i, c) in clients.enumerated() {
            let key = "lane-\(i)"
            let body = batchBody(key: key, stream: "lane", ids: (0..<IngestLaneTests.recordsPerBatch).map { "r\(i)-\($0)" })
            try c.send(
                RawHTTPClient.message("POST", "/v1/batches/lane", headers: [("Idempotency-Key", key)], body: Array(body.serialized.utf8)))
        }
        // Barrier: every batch has been read and waits in the lane.
        try waitUntil(timeout: 30) {
            try b.get("/v1/inspect/stats")["ingestLane"]?["depth"] == .int(Int64(IngestLaneTests.devices))
        }
        let send = try b.request(
            "POST", "/v1/admin/push/send", body: Array(#"{"appId":"x","targetType":"broadcast","title":"now"}"#.utf8))
        #expect(send.status == 200, "\(send.text)")
        let held = try b.get("/v1/inspect/stats")["ingestLane"] ?? .null
        #expect(held["depth"] == .int(Int64(IngestLaneTests.devices)) && held["ran"] == 0, "the send went ahead of them: \(held)")
        // Released, every batch is stored and answered in full, in group commits.
        try b.setFaults(["holdIngest": false])
        for c in clients {
            let r = try c.readResponse(timeoutMs: 60_000)
            #expect(r?.status == 200, "\(r?.text ?? "closed")")
            #expect(try r?.json()["accepted"] == .int(Int64(IngestLaneTests.recordsPerBatch)))
        }
        #expect(try b.get("/v1/inspect/streams/lane")["records"] == .int(Int64(IngestLaneTests.devices * IngestLaneTests.recordsPerBatch)))
        // How many batches share a commit depends on the machine's speed (a 2 ms slice):
        // GroupCommitTests counts the groups with a budget that does not run out.
    }
}
