import PylonCore
import Testing

@testable import PylonBackend

/// The ingest lane's group commit (`IngestLane`, `Backend.commit`): the writes of one slice
/// share a transaction, each job is told after the commit, and a group that fails is committed
/// again job by job, so only the failing job is told an error.
@Suite struct GroupCommitTests {
    static func batch(_ key: String, ids: [String]) throws -> Batch {
        let records = ids.map { #"{"id":"\#($0)","ts":1,"data":{"n":1}}"# }.joined(separator: ",")
        let body = #"{"batch":"\#(key)","stream":"s","records":[\#(records)]}"#
        return try Batch.parse(Array(body.utf8), key: key, stream: "s")
    }

    /// The writes of one batch, recording how its job was told.
    static func writes(_ backend: Backend, _ batch: Batch, fail: Bool = false, told: @escaping (StoreError?) -> Void) -> IngestLane.Writes {
        IngestLane.Writes(
            write: { () throws(StoreError) in
                _ = try backend.store.ingest(batch, receivedAt: 1)
                if fail { throw .busy("this batch fails") }
            },
            done: told)
    }

    /// Commits three batches of two records as one group (batch `failing` throws after its
    /// writes); answers how each was told (batch key → success) and the stream's summary.
    static func commitThree(failing: Int? = nil) throws -> (told: [String: Bool], records: Int64, batches: Int64) {
        let store = try Store(path: ":memory:")
        defer { store.close() }
        let backend = Backend(store: store, maxBody: 1 << 20)
        var told: [String: Bool] = [:]
        let group = try (0..<3).map { i in
            let b = try Self.batch("k\(i)", ids: ["a\(i)", "b\(i)"])
            return Self.writes(backend, b, fail: i == failing) { told["k\(i)"] = $0 == nil }
        }
        backend.commit(group)
        let s = try store.summary(stream: "s")
        return (told, s.records, s.batches)
    }

    @Test func aGroupIsOneTransactionAndEveryJobIsToldAfterIt() throws {
        let r = try Self.commitThree()
        #expect(r.told == ["k0": true, "k1": true, "k2": true])
        #expect(r.records == 6)
    }

    @Test func aFailedGroupIsCommittedJobByJobAndOnlyTheFailingJobIsToldAnError() throws {
        let r = try Self.commitThree(failing: 1)
        #expect(r.told == ["k0": true, "k1": false, "k2": true], "only the failing batch is told an error")
        // The failing batch's writes were rolled back with it; the others are stored once.
        #expect(r.records == 4 && r.batches == 2)
    }

    @Test func theLaneCommitsTheJobsOfOneSliceTogether() throws {
        let loop = Loop.standalone()
        let store = try Store(path: ":memory:")
        defer { store.close() }
        let backend = Backend(store: store, maxBody: 1 << 20)
        // A time budget that never runs out: the groups are cut by size alone.
        backend.startIngestLane(loop: loop, maxGroup: 2, sliceNs: .max)
        var told = 0
        for i in 0..<5 {
            let b = try Self.batch("k\(i)", ids: ["r\(i)"])
            backend.lane?.enqueue { Self.writes(backend, b) { _ in told += 1 } }
        }
        while told < 5 { loop.runNoWait() }
        // Five batches in groups of at most two: three commits.
        #expect(backend.lane?.commits == 3)
        #expect(try store.summary(stream: "s").records == 5)
    }
}
