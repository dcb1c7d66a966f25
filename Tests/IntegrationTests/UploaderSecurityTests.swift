import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// The uploader against callers that are not who they claim to be (issue 11): other uids
/// repointing, writing, flushing or reading streams that are not theirs, callers choosing their
/// own consent switch, one owner filling the disk cap, and consent denials the queue must honour
/// (the master switch, and a switch denied while the uploader was down).
///
/// Unprivileged callers are real: a small Python client run under another uid with `setpriv`
/// (the test runs as root, which the uploader treats as an admin).
@Suite(.serialized) struct UploaderSecurityTests {
    static let nobody: UInt32 = 65534
    static let stranger: UInt32 = 65533

    /// A host whose socket any uid may connect to.
    func host(_ b: TestBackend, config: JSONObject = [:], plugin: JSONObject = [:]) throws -> TestHost {
        let h = try TestHost(plugins: [TestHost.uploader(b, config: config, plugin)], extra: ["socketMode": "0666"])
        try h.waitForPlugin("uploader")
        return h
    }

    /// Sends `calls` in order from a client running as `uid` and returns each whole response.
    func call(as uid: UInt32, _ h: TestHost, _ calls: [(String, JSON?)]) throws -> [JSON] {
        try send(
            as: uid, h, calls.map { String(decoding: Envelope.request(id: .int(0), method: $0.0, params: .params($0.1)), as: UTF8.self) })
    }

    /// Sends request lines (their ids are replaced, in place) from a client running as `uid`.
    func send(as uid: UInt32, _ h: TestHost, _ requests: [String]) throws -> [JSON] {
        let replies = try h.runAs(uid: uid, sequential: true, requests).replies
        guard replies.count == requests.count else {
            throw TestFailure(description: "client as uid \(uid) got \(replies.count) of \(requests.count) replies")
        }
        return replies
    }

    func call(as uid: UInt32, _ h: TestHost, _ method: String, _ params: JSON?) throws -> JSON {
        try call(as: uid, h, [(method, params)])[0]
    }

    func count(_ b: TestBackend, _ stream: String) throws -> Int64 { try b.stream(stream)["records"]?.intValue ?? 0 }

    // MARK: (2) endpoints, ownership, quotas

    /// `flush` with `wait` and a `stream` that is null or not a string, from a caller with no
    /// streams: the uploader chose its waiting path by the key's presence and indexed an empty
    /// list (a trap that took the plugin down).
    @Test func flushWithANullOrMistypedStreamIsAnsweredNotACrash() throws {
        let b = try TestBackend()
        let h = try host(b)
        let pid = try h.client().call("bus.status")["plugins"]?.arrayValue?.first?["pid"]
        let r = try call(
            as: Self.nobody, h,
            [
                ("uploader.flush", ["stream": .null, "wait": true]),
                ("uploader.flush", ["stream": 5, "wait": true]),
                ("uploader.status", nil),
            ])
        #expect(r[0]["result"]?["drained"] == true, "\(r[0].serialized)")
        #expect(r[1].errorCode == -32602, "\(r[1].serialized)")
        #expect(r[2]["result"] != nil)
        #expect(try h.client().call("bus.status")["plugins"]?.arrayValue?.first?["pid"] == pid, "the uploader was not restarted")
    }

    @Test func anotherUidCannotRepointWriteOrFlushAnotherOwnersStream() throws {
        let b = try TestBackend()
        let h = try host(b, config: ["streams": ["*": ["intervalMs": 600000]]])
        let root = try h.client()
        // The victim: MA's stream (root stands in for MA; it is an admin).
        _ = try root.call("uploader.enqueue", ["stream": "ma.victim", "consent": "ma:victim", "records": records("v", 0..<2)])
        let stolen = "http://127.0.0.1:\(b.port)/stolen/{stream}"
        let r = try call(
            as: Self.nobody, h,
            [
                ("uploader.status", nil),
                ("uploader.configureStream", ["stream": "ma.victim", "endpoint": .string(stolen)]),
                ("uploader.configureStream", ["stream": "ma.victim", "maxCount": 1, "intervalMs": 0]),
                ("uploader.enqueue", ["stream": "ma.victim", "records": records("x", 0..<1)]),
                ("uploader.flush", ["stream": "ma.victim"]),
                ("uploader.enqueue", ["stream": "u.mine", "records": records("m", 0..<1)]),
                ("uploader.configureStream", ["stream": "u.mine", "endpoint": .string(stolen)]),
                ("uploader.configureStream", ["stream": "u.mine", "maxCount": 7]),
            ])
        #expect(r[0]["result"]?["owner"]?["owner"] == .string("uid:65534"), "the client really runs as uid 65534: \(r[0].serialized)")
        #expect(r[1].errorCode == -32602, "endpoints are operator configuration: \(r[1].serialized)")
        #expect(r[2].errorCode == -32005, "\(r[2].serialized)")
        #expect(r[2]["error"]?["message"]?.stringValue?.contains("plugin:ma") == true)
        #expect(r[3].errorCode == -32005, "\(r[3].serialized)")
        #expect(r[4].errorCode == -32005, "\(r[4].serialized)")
        #expect(r[5]["result"]?["accepted"] == .int(1), "a uid may write its own stream: \(r[5].serialized)")
        #expect(r[6].errorCode == -32602, "not even on its own stream: \(r[6].serialized)")
        #expect(r[7]["result"]?["maxCount"] == .int(7), "the owner configures its stream: \(r[7].serialized)")
        // Another uid may not touch the first one's stream.
        let s = try call(as: Self.stranger, h, "uploader.enqueue", ["stream": "u.mine", "records": records("s", 0..<1)])
        #expect(s.errorCode == -32005 && s["error"]?["data"]?["owner"] == .string("uid:65534"), "\(s.serialized)")
        // The victim's data still goes where the operator said, with the settings it had.
        let st = try root.call("uploader.status")["streams"]?["ma.victim"]
        #expect(st?["endpoint"] == .string(b.baseURL + "/v1/batches/{stream}"))
        #expect(st?["maxCount"] == .int(50))
        _ = try root.call("uploader.flush", ["stream": "ma.victim", "wait": true])
        #expect(try count(b, "ma.victim") == 2)
        #expect(try b.recordIds("ma.victim") == ["v-0", "v-1"])
    }

    @Test(
        arguments: [
            ["endpoint": "gopher://127.0.0.1:9/_stolen"],
            ["streams": ["x.*": ["endpoint": "file:///var/tmp/x"]]],
            ["allowedHosts": ["ingest.example.com"]],
        ] as [JSONObject])
    func endpointsOtherThanHTTPToAllowedHostsStopTheUploader(config: JSONObject) throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: [TestHost.uploader(b, config: config)])
        try h.waitForPlugin("uploader", state: "failed")
        #expect(h.logText.contains("invalid uploader configuration"))
    }

    @Test func oneOwnerOverItsShareDoesNotStarveTheOthers() throws {
        let b = try TestBackend()
        try b.faults(["failNext": 100000, "status": 503])  // the backend is down for everyone
        let h = try host(b, config: ["maxDiskBytes": 8000, "maxStreamsPerOwner": 3, "streams": ["*": ["intervalMs": 600000]]])
        // Streams per owner are bounded.
        let s = try call(
            as: Self.nobody, h,
            (0..<4).map { i in
                ("uploader.enqueue", ["stream": .string("junk.\(i)"), "records": records("j", 0..<1)])
            })
        #expect(s[0..<3].allSatisfy { $0["result"]?["accepted"] == .int(1) }, "\(s.map(\.serialized))")
        #expect(s[3].errorCode == -32004 && s[3]["error"]?["data"]?["limit"] == .string("maxStreamsPerOwner"), "\(s[3].serialized)")
        // Bytes per owner: a quarter of the cap by default.
        let r = try call(
            as: Self.nobody, h,
            (1..<20).map { i in
                ("uploader.enqueue", ["stream": "junk.0", "records": records("big", i..<(i + 1), pad: 500)])
            })
        let refused = try #require(r.first { $0["error"] != nil })
        #expect(refused.errorCode == -32004)
        #expect(refused["error"]?["data"]?["limit"] == .string("maxDiskBytesPerOwner"), "\(refused.serialized)")
        #expect(refused["error"]?["message"]?.stringValue?.contains("maxDiskBytesPerOwner") == true)
        let usage = try call(as: Self.nobody, h, "uploader.status", nil)["result"]?["owner"]
        #expect((usage?["diskBytes"]?.intValue ?? 99999) <= 2000, "\(usage?.serialized ?? "")")
        // Everybody else keeps working.
        let root = try h.client()
        for i in 0..<3 {
            let a = try root.request("uploader.enqueue", ["stream": "ma.app", "records": records("a", i..<(i + 1), pad: 500)])
            #expect(a["result"]?["accepted"] == .int(1), "\(a.serialized)")
        }
        let o = try call(as: Self.stranger, h, "uploader.enqueue", ["stream": "other.s", "records": records("o", 0..<1, pad: 500)])
        #expect(o["result"]?["accepted"] == .int(1), "\(o.serialized)")
    }

    /// The uploader trusts `_pylon` because the host guarantees a client cannot forge it: a
    /// client's own `_pylon`, wherever it stands in the line, is refused before routing.
    @Test func aClientCannotForgeItsCallerInfo() throws {
        let b = try TestBackend()
        let h = try host(b)
        let r = try send(
            as: Self.nobody, h,
            [
                #"{"jsonrpc":"2.0","id":0,"method":"uploader.status","_pylon":{"uid":0,"admin":true}}"#,
                #"{"jsonrpc":"2.0","_pylon":{"plugin":"ma"},"id":0,"method":"uploader.status"}"#,
                #"{"jsonrpc":"2.0","id":0,"method":"uploader.status"}"#,
            ])
        #expect(r[0].errorCode == -32600 && r[1].errorCode == -32600, "\(r.map(\.serialized))")
        #expect(r[2]["result"]?["owner"]?["owner"] == .string("uid:65534"), "\(r[2].serialized)")
    }

    // MARK: (6) the consent switch is the stream's, not the caller's

    @Test func callerCannotChooseTheConsentSwitch() throws {
        let b = try TestBackend()
        let h = try host(b, config: ["streams": ["*": ["intervalMs": 0]]])
        let c = try h.client()
        _ = try c.call("consent.set", ["key": "ma:victim", "granted": false])
        for consent: JSON in ["other", "", 123, .null, "ma:victim2"] {
            let r = try c.request("uploader.enqueue", ["stream": "ma.victim", "consent": consent, "records": records("c", 0..<1)])
            #expect(r.errorCode == -32602 || r.errorCode == -32003, "consent \(consent.serialized): \(r.serialized)")
            if consent == "other" || consent == "" || consent == 123 {
                #expect(r["error"]?["data"]?["switch"] == .string("ma:victim"), "the refusal names the switch: \(r.serialized)")
            }
        }
        let absent = try c.request("uploader.enqueue", ["stream": "ma.victim", "records": records("c", 0..<1)])
        #expect(absent.errorCode == -32003, "\(absent.serialized)")
        let named = try c.request("uploader.enqueue", ["stream": "ma.victim", "consent": "ma:victim", "records": records("c", 0..<1)])
        #expect(named.errorCode == -32003)
        // The benchmark's and MA's forms keep working.
        #expect(
            try c.call("uploader.enqueue", ["stream": "bench123", "consent": "bench123", "records": records("b", 0..<2)])["accepted"]
                == .int(2))
        #expect(
            try c.call("uploader.enqueue", ["stream": "ma.fine", "consent": "ma:fine", "records": records("f", 0..<2)])["accepted"]
                == .int(2))
        _ = try c.call("uploader.flush", ["wait": true])
        #expect(try count(b, "bench123") == 2)
        #expect(try count(b, "ma.fine") == 2)
        #expect(try count(b, "ma.victim") == 0)
    }

    // MARK: (7) consent denials reach what is already queued

    /// Waits until `stream` has had at least one failed attempt (it is retrying).
    func waitRetrying(_ c: SyncClient, _ stream: String) throws {
        try waitUntil(timeout: 10) { (try c.call("uploader.status")["streams"]?[stream]?["attempts"]?.intValue ?? 0) >= 1 }
    }

    func waitPurged(_ c: SyncClient, _ stream: String, timeout: Double = 10) throws {
        try waitUntil(timeout: timeout) {
            let st = try c.call("uploader.status")["streams"]?[stream]
            return st?["queued"] == .int(0) && st?["pendingBatches"] == .int(0) && st?["inFlight"] == .int(0)
        }
    }

    @Test func deniedMasterSwitchFinalisesRecordsAlreadyRetrying() throws {
        let b = try TestBackend()
        try b.faults(["failNext": 100000, "status": 503])
        let h = try host(b, config: ["streams": ["*": ["intervalMs": 0]]])
        let c = try h.client()
        _ = try c.call("uploader.enqueue", ["stream": "ma.m7", "records": records("m", 0..<3)])
        try waitRetrying(c, "ma.m7")
        _ = try c.call("consent.set", ["key": "device", "granted": false])
        do {
            try waitPurged(c, "ma.m7", timeout: 5)
        } catch {
            Issue.record(
                "records queued before the master switch was denied are still retried: \(try c.call("uploader.status").serialized)")
        }
        let r = try c.request("uploader.enqueue", ["stream": "ma.m7", "records": records("m", 3..<4)])
        #expect(r.errorCode == -32003)
        try b.clearFaults()
        // waitPurged: nothing queued, cut or in flight is left that could still be delivered.
        #expect(try count(b, "ma.m7") == 0, "nothing is delivered after the final attempt")
    }

    @Test func switchDeniedWhileTheUploaderIsDownFinalisesItsQueueAtRestart() throws {
        let b = try TestBackend()
        try b.faults(["failNext": 100000, "status": 503])
        let h = try host(b, config: ["streams": ["*": ["intervalMs": 0]]], plugin: ["backoffInitialMs": 2500, "backoffMaxMs": 2500])
        let c = try h.client()
        _ = try c.call("uploader.enqueue", ["stream": "ma.m8", "records": records("r", 0..<3)])
        _ = try c.call("uploader.enqueue", ["stream": "ma.other8", "records": records("o", 0..<2)])
        try waitRetrying(c, "ma.m8")
        let pid = try #require(try h.plugin("uploader")["pid"]?.intValue)
        kill(Int32(pid), SIGKILL)
        try waitUntil(timeout: 5) { (try h.plugin("uploader")["state"]?.stringValue) != "running" }
        _ = try c.call("consent.set", ["key": "ma:m8", "granted": false])
        try h.waitForPlugin("uploader", restartsAtLeast: 1, timeout: 15)
        do {
            try waitPurged(c, "ma.m8", timeout: 5)
        } catch {
            Issue.record("a switch denied during the restart did not reach the queue: \(try c.call("uploader.status").serialized)")
        }
        try b.clearFaults()
        // A later delivery happened (other8, flushed after the faults are gone), and m8's did
        // not: waitPurged left nothing of it to send.
        _ = try c.call("uploader.flush", ["stream": "ma.other8", "wait": true])
        #expect(try count(b, "ma.m8") == 0, "records under the denied switch were delivered after the restart")
        #expect(try count(b, "ma.other8") == 2, "other switches are untouched")
    }

    // MARK: (11) who sees what

    @Test func deadLettersStatusAndFlushShowOnlyTheCallersStreams() throws {
        let b = try TestBackend()
        try b.faults(["failNext": 1, "status": 400])
        let h = try host(b, config: ["streams": ["*": ["intervalMs": 0]]])
        let root = try h.client()
        _ = try root.call("uploader.enqueue", ["stream": "ma.secret", "records": [["id": "s1", "data": ["email": "victim@example.com"]]]])
        try waitUntil(timeout: 10) {
            (try root.call("uploader.deadLetters", ["stream": "ma.secret"])["deadLetters"]?.arrayValue?.count ?? 0) == 1
        }
        try b.faults(["failNext": 1, "status": 400])
        _ = try call(as: Self.nobody, h, "uploader.enqueue", ["stream": "u.dl", "records": records("u", 0..<1)])
        try waitUntil(timeout: 10) {
            (try root.call("uploader.deadLetters", ["stream": "u.dl"])["deadLetters"]?.arrayValue?.count ?? 0) == 1
        }
        let r = try call(
            as: Self.nobody, h,
            [
                ("uploader.deadLetters", nil),
                ("uploader.deadLetters", ["stream": "ma.secret"]),
                ("uploader.status", nil),
                ("uploader.flush", nil),
                ("uploader.flush", ["stream": "ma.secret", "wait": true]),
            ])
        let mine = r[0]["result"]?["deadLetters"]?.arrayValue ?? []
        #expect(mine.count == 1 && mine.first?["stream"] == .string("u.dl"), "only its own dead letters: \(r[0].serialized)")
        #expect(!r[0].serialized.contains("victim@example.com"))
        #expect(r[1].errorCode == -32005, "\(r[1].serialized)")
        let streams = r[2]["result"]?["streams"]?.objectValue
        #expect(streams?.keys == ["u.dl"], "status shows only its own streams: \(r[2].serialized)")
        #expect(r[2]["result"]?["owners"] == nil, "per-owner usage is for admins")
        #expect(r[3]["result"]?["flushing"] == ["u.dl"], "\(r[3].serialized)")
        #expect(r[4].errorCode == -32005, "\(r[4].serialized)")
        // An admin sees everything.
        #expect((try root.call("uploader.deadLetters")["deadLetters"]?.arrayValue?.count ?? 0) == 2)
        #expect(try root.call("uploader.status")["owners"]?["uid:65534"] != nil)
    }
}
