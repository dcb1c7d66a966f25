import Foundation
import PylonClientKit
import TestSupport
import Testing

/// Several `pylon-backend` processes on one PostgreSQL serve one consistent API: the same
/// request sent to two instances at the same moment has one outcome (the database decides:
/// unique keys, serializable transactions retried on conflict, advisory locks for identity
/// merges), and a PostgreSQL restart costs the requests meanwhile a 503, not the process.
@Suite(.serialized) struct FleetStateTests {
    /// Rounds per race: each is one chance for the two instances to interleave.
    static let rounds = 25
    /// Records per raced batch (a longer transaction: more overlap).
    static let batchRecords = 200

    /// Two instances on one new database (with `extra` arguments each).
    static func pair(_ extra: [String] = []) throws -> (BackendProcess, BackendProcess) {
        let a = try BackendProcess(extra, store: .postgres)
        let b = try BackendProcess(extra, database: a.database)
        return (a, b)
    }

    @Test func concurrentIdenticalMergesOnTwoInstancesYieldOneEUID() throws {
        let (a, b) = try FleetStateTests.pair()
        for round in 0..<FleetStateTests.rounds {
            let identity: JSON = ["user_id": .string("u\(round)"), "email": .string("e\(round)@example.com")]
            let replies = try race([a.port, b.port]) { i in
                ("POST", "/v1/ma/app/identify", ["deviceId": .string("d\(round)-\(i)"), "euid": .null, "identity": identity])
            }
            let euids = try replies.map { r -> JSON in
                guard r.status == 200 else { throw TestFailure(description: "round \(round): \(r.status) \(r.text)") }
                return try r.json()["euid"] ?? .null
            }
            #expect(euids[0] != .null && euids[0] == euids[1], "round \(round): \(replies.map(\.text))")
            #expect(try a.findUser("user_id=u\(round)") == euids[0])
            #expect(try b.findUser("deviceId=d\(round)-0") == euids[0] && b.findUser("deviceId=d\(round)-1") == euids[0])
        }
    }

    @Test func oneBatchPostedToTwoInstancesAtOnceIsStoredOnce() throws {
        let (a, b) = try FleetStateTests.pair()
        for round in 0..<FleetStateTests.rounds {
            let key = "batch-\(round)"
            let body = batchBody(key: key, stream: "s", ids: (0..<FleetStateTests.batchRecords).map { "r\(round)-\($0)" })
            let replies = try race([a.port, b.port]) { _ in ("POST", "/v1/batches/s", body, key) }
            let json = try replies.map { r -> JSON in
                guard r.status == 200 else { throw TestFailure(description: "round \(round): \(r.status) \(r.text)") }
                return try r.json()
            }
            #expect(json.compactMap { $0["accepted"]?.intValue }.reduce(0, +) == Int64(FleetStateTests.batchRecords), "\(json)")
            #expect(json.filter { $0["duplicateBatch"] == true }.count == 1, "\(json)")
        }
        let s = try a.get("/v1/inspect/streams/s")
        #expect(s["records"] == .int(Int64(FleetStateTests.batchRecords * FleetStateTests.rounds)))
        #expect(s["batches"] == .int(Int64(FleetStateTests.rounds)))
        #expect(s["duplicateBatches"] == .int(Int64(FleetStateTests.rounds)))
    }

    @Test func concurrentSendsWithOneMsgKeyOnTwoInstancesSendOnce() throws {
        let broker = try AnonymousBroker()
        let (a, b) = try FleetStateTests.pair(["--mqtt", "127.0.0.1:\(broker.port)"])
        for p in [a, b] {
            try waitUntil(timeout: 10) {
                try p.request("POST", "/v1/admin/push/send", body: Array(#"{"appId":"x","targetType":"broadcast"}"#.utf8)).status == 200
            }
        }
        for round in 0..<FleetStateTests.rounds {
            let send: JSON = ["appId": "a1", "targetType": "user", "target": "alice", "title": "t", "msgKey": .string("k\(round)")]
            let replies = try race([a.port, b.port]) { _ in ("POST", "/v1/admin/push/send", send) }
            let json = try replies.map { r -> JSON in
                guard r.status == 200 else { throw TestFailure(description: "round \(round): \(r.status) \(r.text)") }
                return try r.json()
            }
            #expect(json.filter { $0["duplicate"] == false }.count == 1, "\(json)")
            #expect(json[0]["msgId"] == json[1]["msgId"], "\(json)")
        }
        let sends = try a.get("/v1/inspect/push/sends")["sends"]?.arrayValue ?? []
        #expect(sends.filter { $0["appId"] == "a1" }.count == FleetStateTests.rounds)
    }

    @Test func aPostgreSQLRestartAnswers503AndTheBackendRecovers() throws {
        let server = try PostgresServer(durable: true)
        defer { server.shutdown() }
        let b = try BackendProcess(database: ["--db", try server.createDatabase()])
        #expect(try b.postBatch("s", key: "k1", batchBody(key: "k1", stream: "s", ids: ["a"])).status == 200)
        server.stop()
        let during = try b.postBatch("s", key: "k2", batchBody(key: "k2", stream: "s", ids: ["b"]))
        #expect(during.status == 503 && during.headers["retry-after"] == "1", "\(during.status) \(during.text)")
        // Stats still answer, naming the database's error; the reconnect runs in the background.
        #expect(try b.get("/v1/inspect/stats")["databaseError"]?.stringValue != nil)
        try server.start()
        try waitUntil(timeout: 10) { try b.get("/v1/inspect/stats")["databaseError"] == nil }
        #expect(try b.postBatch("s", key: "k2", batchBody(key: "k2", stream: "s", ids: ["b"])).json()["accepted"] == 1)
        #expect(try b.get("/v1/inspect/streams/s")["records"] == 2)
        #expect(b.process.isRunning)
    }
}

/// Sends one request per port at the same moment (each on its own connection, opened first, all
/// released by one barrier) and answers the replies in port order. `request(i)`: method, target,
/// JSON body and an optional Idempotency-Key.
func race(_ ports: [UInt16], _ request: (Int) -> (String, String, JSON, String?)) throws -> [HTTPReply] {
    let messages = ports.indices.map { i -> [UInt8] in
        let (method, target, body, key) = request(i)
        var headers: [(String, String)] = [("Content-Type", "application/json")]
        if let key { headers.append(("Idempotency-Key", key)) }
        return RawHTTPClient.message(method, target, headers: headers, body: Array(body.serialized.utf8))
    }
    let results = RaceResults(ports.count)
    let barrier = RaceBarrier(ports.count)
    // One thread each, not DispatchQueue.concurrentPerform: on one CPU (`taskset -c 0`) that
    // runs the iterations one after another, and the first waits at the barrier forever.
    let done = DispatchGroup()
    for i in ports.indices {
        done.enter()
        let port = ports[i], message = messages[i]
        Thread {
            defer { done.leave() }
            do {
                let c = try RawHTTPClient(port: port)
                barrier.wait()
                try c.send(message)
                results.set(i, .success(try c.readResponse()))
            } catch {
                barrier.wait()
                results.set(i, .failure(error))
            }
        }.start()
    }
    done.wait()
    return try results.all().map { r in
        guard let reply = try r.get() else { throw TestFailure(description: "no response") }
        return reply
    }
}

func race(_ ports: [UInt16], _ request: (Int) -> (String, String, JSON)) throws -> [HTTPReply] {
    try race(ports) { i -> (String, String, JSON, String?) in
        let (m, t, b) = request(i)
        return (m, t, b, nil)
    }
}

final class RaceBarrier: @unchecked Sendable {
    private let cond = NSCondition()
    private var waiting: Int
    init(_ n: Int) { waiting = n }
    func wait() {
        cond.lock()
        waiting -= 1
        if waiting <= 0 { cond.broadcast() }
        while waiting > 0 { cond.wait() }
        cond.unlock()
    }
}

final class RaceResults: @unchecked Sendable {
    private let lock = NSLock()
    private var values: [Result<HTTPReply?, any Error>]
    init(_ n: Int) { values = Array(repeating: .success(nil), count: n) }
    func set(_ i: Int, _ r: Result<HTTPReply?, any Error>) {
        lock.lock()
        values[i] = r
        lock.unlock()
    }
    func all() -> [Result<HTTPReply?, any Error>] {
        lock.lock()
        defer { lock.unlock() }
        return values
    }
}
