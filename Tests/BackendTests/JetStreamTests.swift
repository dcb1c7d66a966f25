import Foundation
import PylonClientKit
import PylonStore
import TestSupport
import Testing

@testable import PylonBackend

/// `pylon-backend --nats`: batches published to a real JetStream (nats-server started per
/// test on free ports, SIGKILLed at the end) and read back with tools/pylon-stream-consumer.
@Suite(.serialized) struct JetStreamTests {
    /// A backend in NATS mode; waits until it reports the stream ready.
    func natsBackend(_ cluster: NATSCluster, _ extra: [String] = []) throws -> BackendProcess {
        let b = try BackendProcess(["--nats", cluster.urls] + extra)
        do {
            try waitUntil(timeout: 60) { try b.get("/v1/inspect/stats")["nats"]?["ready"] == true }
        } catch {
            throw TestFailure(description: "stream never ready; backend log: \(b.logText)")
        }
        return b
    }

    func stats(_ b: BackendProcess) throws -> JSON { try b.get("/v1/inspect/stats") }

    @Test func sameBatchTwiceIsOneMessage() throws {
        let nats = try NATSCluster(nodes: 1)
        let a = try natsBackend(nats)
        // A second instance with a database of its own: its ledger does not know the key, so
        // only JetStream's duplicate window can tell it the batch is stored.
        let b = try natsBackend(nats)
        let body = batchBody(key: "k1", stream: "events", ids: ["r1", "r2", "r3"])

        let first = try a.postBatch("events", key: "k1", body)
        #expect(first.status == 200)
        #expect(try first.json()["accepted"] == 3)
        #expect(try first.json()["duplicateBatch"] == false)
        #expect(try first.json()["streamSeq"] == 1)

        // Within the duplicate window, through JetStream: one message, answered duplicate.
        let viaOther = try b.postBatch("events", key: "k1", body)
        #expect(viaOther.status == 200)
        #expect(try viaOther.json()["duplicateBatch"] == true)
        #expect(try viaOther.json()["accepted"] == 0)
        #expect(try stats(b)["nats"]?["duplicates"] == 1)

        // The key is in A's ledger: answered duplicate without publishing at all.
        let again = try a.postBatch("events", key: "k1", body)
        #expect(again.status == 200)
        #expect(try again.json()["duplicateBatch"] == true)
        #expect(try again.json()["streamSeq"] == nil)
        let sa = try stats(a)
        #expect(sa["nats"]?["published"] == 1)
        #expect(sa["batches"] == 1)
        #expect(sa["duplicateBatches"] == 1)
        #expect(sa["records"] == 0)  // NATS mode keeps keys and counters, not records

        // A gzip body goes to the stream decoded, as JSON.
        let gz = try Gzip.compress(Array(batchBody(key: "k2", stream: "odd.name *", ids: ["x"]).serialized.utf8))
        let g = try a.request(
            "POST", "/v1/batches/odd.name%20*", headers: [("Idempotency-Key", "k2"), ("Content-Encoding", "gzip")], body: gz)
        #expect(g.status == 200)

        let messages = try StreamReader.readAll(urls: nats.urls, durable: "t-dedup")
        #expect(messages.map(\.msgId) == ["k1", "k2"])
        #expect(messages.first?.stream == "events")
        #expect(messages.first?.subject == "pylon.ingest.events")
        #expect(messages.first?.records == 3)
        let ids = (messages.first?.batch["records"] as? [[String: Any]])?.compactMap { $0["id"] as? String }
        #expect(ids == ["r1", "r2", "r3"])
        #expect(messages.last?.stream == "odd.name *")
        #expect(messages.last?.subject == "pylon.ingest.odd%2Ename%20%2A")
        #expect(messages.last?.batch["batch"] as? String == "k2")
    }

    @Test func lostConnectionAnswers503ThenReconnects() throws {
        let nats = try NATSCluster(nodes: 1)
        let b = try natsBackend(nats, ["--nats-ack-timeout-ms", "1000"])
        let body = batchBody(key: "k-down", stream: "events", ids: ["a"])
        nats.kill(0)
        let down = try b.postBatch("events", key: "k-down", body)
        #expect(down.status == 503)
        #expect(down.headers["retry-after"] == "1")
        #expect(try down.json()["code"] == "stream_unavailable")
        try nats.start(0)
        var last: HTTPReply?
        try waitUntil(timeout: 30) {
            last = try b.postBatch("events", key: "k-down", body)
            return last?.status == 200
        }
        #expect(try last?.json()["accepted"] == 1)
        #expect(try StreamReader.readAll(urls: nats.urls, durable: "t-down").map(\.msgId) == ["k-down"])
        #expect(try stats(b)["nats"]?["connects"]?.intValue ?? 0 >= 2)
    }

    @Test func unacknowledgedBatchTimesOutAndPendingIsBounded() throws {
        let nats = try NATSCluster(nodes: 1)
        let b = try natsBackend(nats, ["--nats-ack-timeout-ms", "1000", "--nats-max-pending", "1"])
        nats.pause(0)  // the connection stays up; nothing is acknowledged
        defer { nats.resume(0) }
        let waiting = try b.client()
        try waiting.send(
            RawHTTPClient.message(
                "POST", "/v1/batches/events", headers: [("Idempotency-Key", "k-late")],
                body: Array(batchBody(key: "k-late", stream: "events", ids: ["a"]).serialized.utf8)))
        try waitUntil(timeout: 10) { try stats(b)["nats"]?["inFlight"] == 1 }
        let full = try b.postBatch("events", key: "k-other", batchBody(key: "k-other", stream: "events", ids: ["b"]))
        #expect(full.status == 503)
        #expect(try full.json()["code"] == "server_busy")
        #expect(full.headers["retry-after"] == "1")

        let timedOut = try waiting.readResponse()
        #expect(timedOut?.status == 503)
        #expect(try timedOut?.json()["code"] == "stream_unavailable")
        #expect(timedOut?.headers["retry-after"] == "1")

        // The server wakes up and stores the batch: its late ack still records the key, so
        // the device's re-send is answered duplicate without a second message.
        nats.resume(0)
        try waitUntil(timeout: 10) { try stats(b)["nats"]?["lateAcks"] == 1 }
        let resend = try b.postBatch("events", key: "k-late", batchBody(key: "k-late", stream: "events", ids: ["a"]))
        #expect(resend.status == 200)
        #expect(try resend.json()["duplicateBatch"] == true)
        #expect(try StreamReader.readAll(urls: nats.urls, durable: "t-late").map(\.msgId) == ["k-late"])
    }

    /// An `authorization` block given as extra node configuration (the generator's hook for
    /// accounts and listeners): the right login publishes, a wrong one never gets ready.
    @Test func natsLoginFromAPasswordFile() throws {
        let password = "nats-password-0123456789"
        let nats = try NATSCluster(nodes: 1) { _ in "authorization { user: pylon, password: \"\(password)\" }" }
        let pw = nats.dir + "/nats.password"
        try (password + "\n").write(toFile: pw, atomically: true, encoding: .utf8)
        chmod(pw, 0o600)
        let b = try natsBackend(nats, ["--nats-user", "pylon", "--nats-password-file", pw])
        #expect(try b.postBatch("events", key: "k-auth", batchBody(key: "k-auth", stream: "events", ids: ["a"])).status == 200)
        #expect(
            try StreamReader.readAll(urls: nats.urls, durable: "t-auth", login: ("pylon", pw)).map(\.msgId) == ["k-auth"])

        let wrong = nats.dir + "/wrong.password"
        try "not-the-password-0123456789\n".write(toFile: wrong, atomically: true, encoding: .utf8)
        chmod(wrong, 0o600)
        let refused = try BackendProcess(["--nats", nats.urls, "--nats-user", "pylon", "--nats-password-file", wrong])
        let r = try refused.postBatch("events", key: "k-no", batchBody(key: "k-no", stream: "events", ids: ["a"]))
        #expect(r.status == 503)
        #expect(try r.json()["code"] == "stream_unavailable")
        #expect(try stats(refused)["nats"]?["ready"] == false)
    }

    @Test func aBatchOfMaxBodyFitsAndOneOverMaxPayloadIs413() throws {
        let nats = try NATSCluster(nodes: 1)  // max_payload 2 MB (tools/pylon-nats-cluster)
        let b = try natsBackend(nats, ["--max-body", String(4 << 20)])
        func body(_ key: String, bytes: Int) -> [UInt8] {
            Array(#"{"records":[{"id":"a","ts":1,"data":"\#(String(repeating: "x", count: bytes))"}]}"#.utf8)
        }
        let fits = try b.request("POST", "/v1/batches/events", headers: [("Idempotency-Key", "big")], body: body("big", bytes: 1 << 20))
        #expect(fits.status == 200)
        let over = try b.request("POST", "/v1/batches/events", headers: [("Idempotency-Key", "huge")], body: body("huge", bytes: 3 << 20))
        #expect(over.status == 413)
        #expect(try over.json()["code"] == "payload_too_large")
        #expect(try StreamReader.readAll(urls: nats.urls, durable: "t-big").map(\.msgId) == ["big"])
    }

    /// Stream R3 on three nodes; the stream leader is killed with SIGKILL during a run of
    /// posts that a device would make (each retried on 503 until acknowledged). Afterwards
    /// every acknowledged batch is in the stream exactly once, and nothing else is.
    @Test func clusterNodeLossKeepsEveryAcknowledgedBatchOnce() throws {
        let nats = try NATSCluster(nodes: 3)
        let b = try natsBackend(nats, ["--nats-replicas", "3", "--nats-ack-timeout-ms", "2000"])
        let total = 150
        let killAt = 50
        var acked: [String] = []
        var refused = 0
        var killed: String?
        for i in 0..<total {
            if i == killAt {
                let info = try StreamReader.info(urls: nats.urls)
                let leader = (info["cluster"] as? [String: Any])?["leader"] as? String
                let replicas = (info["config"] as? [String: Any])?["num_replicas"] as? Int
                #expect(replicas == 3)
                let idx = try #require(leader.flatMap { nats.index(named: $0) })
                nats.kill(idx)
                killed = leader
            }
            let key = "nl-\(i)"
            let body = batchBody(key: key, stream: "events", ids: ["\(i)-a", "\(i)-b"])
            var ok = false
            try waitUntil(timeout: 60) {
                let r = try b.postBatch("events", key: key, body)
                if r.status != 200 { refused += 1 }
                ok = r.status == 200
                return ok
            }
            if ok { acked.append(key) }
        }
        #expect(acked.count == total)
        let survivors = nats.nodes.filter { $0.process != nil }.map { "nats://127.0.0.1:\($0.clientPort)" }.joined(separator: ",")
        let messages = try StreamReader.readAll(urls: survivors, durable: "t-nodeloss")
        var count: [String: Int] = [:]
        for m in messages { count[m.msgId, default: 0] += 1 }
        let missing = acked.filter { count[$0] == nil }
        let twice = count.filter { $0.value > 1 }.map(\.key).sorted()
        #expect(missing.isEmpty, "acknowledged but not in the stream: \(missing)")
        #expect(twice.isEmpty, "in the stream more than once: \(twice)")
        #expect(messages.count == acked.count)
        let info = try StreamReader.info(urls: survivors)
        let newLeader = (info["cluster"] as? [String: Any])?["leader"] as? String
        #expect(newLeader != nil && newLeader != killed)
        print("node loss: killed \(killed ?? "?"), \(refused) posts answered non-200 and retried, \(messages.count) messages")
    }

    // MARK: Pure parts

    @Test func subjectsEncodeEveryStreamNameAsOneToken() {
        #expect(JetStreamWire.subject(prefix: "pylon.ingest", stream: "events") == "pylon.ingest.events")
        #expect(JetStreamWire.subject(prefix: "p", stream: "a.b*>c d-_") == "p.a%2Eb%2A%3Ec%20d-_")
        #expect(JetStreamWire.subject(prefix: "p", stream: "é") == "p.%C3%A9")
        #expect(JetStreamWire.invalidPrefix("pylon.ingest") == nil)
        #expect(JetStreamWire.invalidPrefix("pylon..x") != nil)
        #expect(JetStreamWire.invalidPrefix("pylon.>") != nil)
        #expect(JetStreamWire.invalidStreamName("PYLON_INGEST") == nil)
        #expect(JetStreamWire.invalidStreamName("A.B") != nil)
    }

    @Test func repliesAreReadDefensively() {
        #expect(JetStreamWire.parseReply(Array(#"{"stream":"S","seq":7}"#.utf8)) == .ack(stream: "S", seq: 7, duplicate: false))
        #expect(
            JetStreamWire.parseReply(Array(#"{"stream":"S","seq":7,"duplicate":true}"#.utf8)) == .ack(stream: "S", seq: 7, duplicate: true))
        #expect(
            JetStreamWire.parseReply(Array(#"{"error":{"code":404,"err_code":10059,"description":"stream not found"}}"#.utf8))
                == .error(code: 404, errCode: 10059, description: "stream not found"))
        if case .invalid = JetStreamWire.parseReply(Array("\u{0}garbage".utf8)) {} else { Issue.record("garbage accepted") }
        if case .invalid = JetStreamWire.parseReply(Array(#"{"seq":"x"}"#.utf8)) {} else { Issue.record("odd reply accepted") }
    }

    @Test func natsFlagsParseAndConflictsAreRefused() throws {
        let o = try Options.parse(["--nats", "nats://a:1, nats://b:2", "--nats-replicas", "3", "--max-body", "2048"])
        #expect(o.nats?.urls == ["nats://a:1", "nats://b:2"])
        #expect(o.nats?.stream.replicas == 3)
        #expect(o.nats?.stream.name == "PYLON_INGEST")
        #expect(o.nats?.stream.maxMessageBytes == 2048 + Limits.natsHeaderAllowance)
        #expect(try Options.parse([]).nats == nil)
        for bad in [
            ["--nats-stream", "S"], ["--nats", "a:1"], ["--nats", "nats://a:1", "--nats-stream", "A.B"],
            ["--nats", "nats://a:1", "--nats-user", "u"], ["--nats", "nats://a:1", "--nats-replicas", "6"],
            ["--nats", "nats://a:1", "--nats-creds", "c", "--nats-user", "u", "--nats-password-file", "p"],
            ["--nats", "nats://a:1", "--nats-subject-prefix", "a.>"],
        ] {
            #expect(throws: Options.UsageError.self, "\(bad)") { try Options.parse(bad) }
        }
    }

    @Test func pendingPublishesExpireInOrderAndStayBounded() {
        var p = PendingPublishes<String>(maxInFlight: 2, ackTimeoutMs: 100, lateAckMs: 1000)
        let t1 = p.add("a", now: 0)!
        let t2 = p.add("b", now: 10)!
        #expect(p.add("c", now: 20) == nil)  // full
        #expect(p.nextWake == 100)
        #expect(p.expire(now: 99).isEmpty)
        #expect(p.expire(now: 100) == ["a"])
        #expect(p.inFlight == 1)
        let t3 = p.add("c", now: 100)!
        #expect(p.resolve(t2)?.late == false)
        #expect(p.resolve(t2) == nil)  // once
        #expect(p.nextWake == 200)  // c's deadline; a is forgotten at 1100
        #expect(p.resolve(t1)?.late == true)  // a late ack is still delivered
        #expect(p.expire(now: 200) == ["c"])
        #expect(p.nextWake == 1200)
        #expect(p.expire(now: 1200).isEmpty)
        #expect(p.resolve(t3) == nil)  // forgotten
        #expect(p.nextWake == nil)
        #expect(p.entries.isEmpty)
        // A lost connection makes everything in flight late at once.
        let t4 = p.add("d", now: 2000)!
        _ = p.add("e", now: 2001)!
        #expect(p.expireAll(now: 2002) == ["d", "e"])
        #expect(p.inFlight == 0)
        #expect(p.resolve(t4)?.late == true)
        #expect(p.nextWake == 3002)

        // At most 2 × maxInFlight entries: the oldest late one is forgotten to make room.
        var q = PendingPublishes<String>(maxInFlight: 1, ackTimeoutMs: 100, lateAckMs: 10_000)
        let a = q.add("a", now: 0)!
        #expect(q.expire(now: 100) == ["a"])
        let b = q.add("b", now: 100)!
        #expect(q.expire(now: 200) == ["b"])
        _ = q.add("c", now: 200)!
        #expect(q.entries.count == 2)
        #expect(q.resolve(a) == nil)
        #expect(q.resolve(b)?.late == true)
    }
}
