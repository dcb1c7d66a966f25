import Foundation
import PylonClientKit
import TestSupport
import Testing

/// `--nats` with two instances on one PostgreSQL ledger (issue 34 item 5): the same batch
/// posted to both at the same instant is one message in the stream, and exactly one of the two
/// answers says it was new (`duplicateBatch: false`), every time — whichever instance's
/// acknowledgement reaches the ledger first. Part of `JetStreamTests` (serialized: one NATS
/// server at a time).
extension JetStreamTests {
    static let raceTries = 20

    @Test func oneBatchPostedToTwoInstancesAtOnceIsNewForExactlyOne() throws {
        let nats = try NATSCluster(nodes: 1)
        let a = try BackendProcess(["--nats", nats.urls], store: .postgres)
        let b = try BackendProcess(["--nats", nats.urls], database: a.database)
        for p in [a, b] {
            do {
                try waitUntil(timeout: 60) { try p.get("/v1/inspect/stats")["nats"]?["ready"] == true }
            } catch {
                throw TestFailure(description: "stream never ready; backend log: \(p.logText)")
            }
        }
        var bothDuplicate = 0
        for i in 0..<Self.raceTries {
            let key = "race-\(i)"
            let body = batchBody(key: key, stream: "events", ids: ["\(i)-a", "\(i)-b"])
            let replies = try race([a.port, b.port]) { _ in ("POST", "/v1/batches/events", body, key) }
            let json = try replies.map { r -> JSON in
                guard r.status == 200 else { throw TestFailure(description: "try \(i): \(r.status) \(r.text)") }
                return try r.json()
            }
            let fresh = json.filter { $0["duplicateBatch"] == false }
            if fresh.isEmpty { bothDuplicate += 1 }
            #expect(fresh.count == 1, "try \(i): \(json)")
            #expect(fresh.first?["accepted"] == 2, "try \(i): \(json)")
        }
        #expect(bothDuplicate == 0)
        let s = try a.get("/v1/inspect/stats")
        #expect(s["batches"] == .int(Int64(Self.raceTries)))
        #expect(s["duplicateBatches"] == .int(Int64(Self.raceTries)), "each race's loser counted once")
        let messages = try StreamReader.readAll(urls: nats.urls, durable: "t-race")
        #expect(messages.count == Self.raceTries)
    }
}
