import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// Issue 21 item 8: dead letters against the disk, and what the endpoint's answers do to a
/// queue. The endpoint is `UploaderTestServer` (it answers the statuses a test scripts: 400,
/// 401, 403, redirects), so these tests need no fault API of the reference backend.
@Suite(.serialized) struct UploaderDeadLetterTests {
    static let nobody: UInt32 = 65534

    func host(_ server: UploaderTestServer, config extra: JSONObject = [:]) throws -> TestHost {
        var cfg: JSONObject = [
            "endpoint": .string(server.baseURL + "/v1/batches/{stream}"), "retryInitialMs": 100, "retryMaxMs": 2000,
            "streams": ["*": ["intervalMs": 600_000]],  // only a flush sends
        ]
        for (k, v) in extra { cfg[k] = v }
        let h = try TestHost(
            plugins: [
                [
                    "name": "uploader", "exec": "pylon-uploader", "config": .object(cfg), "backoffInitialMs": 50,
                    "heartbeatIntervalMs": 500, "heartbeatTimeoutMs": 5000,
                ]
            ], extra: ["socketMode": "0666"])
        try h.waitForPlugin("uploader")
        return h
    }

    func enqueue(_ c: SyncClient, _ stream: String, _ recs: JSON) throws -> JSON {
        try c.call("uploader.enqueue", ["stream": .string(stream), "records": recs])
    }

    /// The flood of the issue: every batch refused with 400. Before, each set-aside released its
    /// bytes, so the owner enqueued without end (2.78 GB against a 64 MiB cap in 65 s). Now the
    /// dead letters stay charged: the owner's enqueues are refused at its share, the others'
    /// are not, and a discard gives the room back. A waiting flush says what it set aside.
    @Test func deadLettersCountAgainstTheOwnersShareUntilDiscarded() throws {
        let server = try UploaderTestServer()
        try server.answer([], then: 400)
        let h = try host(server, config: ["maxDiskBytesPerOwner": 40_000])
        let c = try h.client()
        var refused: RPCError?
        var setAside: Int64 = 0
        for round in 0..<60 {
            do {
                _ = try enqueue(c, "flood", records("f\(round)", 0..<10, pad: 200))
            } catch let e as RPCError {
                refused = e
                break
            }
            let r = try c.call("uploader.flush", ["stream": "flood", "wait": true])
            #expect(r["deadLettered"] == .int(10), "\(r)")
            #expect(r["delivered"] == .int(0))
            setAside += r["deadLettered"]?.intValue ?? 0
        }
        #expect(refused?.code == -32004, "the share refuses once it holds dead letters: \(String(describing: refused))")
        #expect(refused?.data?["limit"] == "maxDiskBytesPerOwner")
        let st = try c.call("uploader.status")
        let flood = st["streams"]?["flood"]
        #expect(flood?["deadLetters"] == .int(setAside))
        let dlBytes = flood?["deadLetterBytes"]?.intValue ?? 0
        #expect(dlBytes > 30_000 && dlBytes <= 40_000, "\(st)")
        #expect(st["diskBytes"]?.intValue == dlBytes && st["owner"]?["diskBytes"]?.intValue == dlBytes)
        // Another owner still has its share.
        let other = try h.runAs(
            uid: Self.nobody, sequential: true,
            [
                String(
                    decoding: Envelope.request(
                        id: .int(1), method: "uploader.enqueue",
                        params: .params(["stream": "u.other", "records": records("o", 0..<1)])), as: UTF8.self)
            ]
        ).replies
        #expect(other.first?["result"]?["accepted"] == .int(1), "\(other)")
        // A discard gives the room back.
        let d = try c.call("uploader.discard", ["stream": "flood"])
        #expect(d["discarded"] == .int(setAside) && d["deadLetters"] == .int(0))
        let after = try c.call("uploader.status")["streams"]?["flood"]
        #expect(after?["setAside"] == .int(setAside), "a counter, not lowered: \(String(describing: after))")
        #expect(try c.call("uploader.status")["streams"]?["flood"]?["deadLetterBytes"] == .int(0))
        #expect(try enqueue(c, "flood", records("after", 0..<10, pad: 200))["accepted"] == .int(10))
    }

    /// Records the backend would refuse are refused at the enqueue: nothing reaches the endpoint.
    @Test func idsTheBackendRefusesAreRefusedAtTheEnqueue() throws {
        let server = try UploaderTestServer()
        let h = try host(server)
        let c = try h.client()
        for id in ["tab\there", "nul\u{0}", "del\u{7F}"] {
            do {
                _ = try enqueue(c, "ctl", [["id": .string(id), "data": 1]])
                Issue.record("id \(id.debugDescription) was accepted")
            } catch let e as RPCError {
                #expect(e.code == -32602 && e.message.contains("control characters"), "\(e)")
            }
        }
        #expect(try c.call("uploader.flush", ["wait": true])["drained"] == .bool(true))
        #expect(try server.log().isEmpty)
    }

    /// A dead letter re-queued by its owner goes again (and is delivered); a stranger may neither
    /// re-queue nor discard it, nor list it.
    @Test func theOwnerRequeuesDeadLettersAndAStrangerCannot() throws {
        let server = try UploaderTestServer()
        try server.answer([400])
        let h = try host(server)
        let c = try h.client()
        _ = try enqueue(c, "rq", records("r", 0..<3))
        let first = try c.call("uploader.flush", ["stream": "rq", "wait": true])
        #expect(first["deadLettered"] == .int(3) && first["deadLetters"] == .int(3), "\(first)")
        func line(_ m: String, _ p: JSON) -> String {
            String(decoding: Envelope.request(id: .int(1), method: m, params: .params(p)), as: UTF8.self)
        }
        let stranger = try h.runAs(
            uid: Self.nobody, sequential: true,
            [line("uploader.requeue", ["stream": "rq"]), line("uploader.discard", ["stream": "rq"]), line("uploader.deadLetters", [:])]
        ).replies
        #expect(stranger.count == 3)
        #expect(stranger.first?.errorCode == -32005 && stranger.dropFirst().first?.errorCode == -32005, "\(stranger)")
        #expect(stranger.last?["result"]?["deadLetters"] == .array([]))
        #expect(throws: RPCError.self) { try c.call("uploader.requeue", ["stream": "rq", "ids": "r-0"]) }
        let r = try c.call("uploader.requeue", ["stream": "rq", "ids": ["r-0", "r-2"]])
        #expect(r["requeued"] == .int(2) && r["deadLetters"] == .int(1), "\(r)")
        let second = try c.call("uploader.flush", ["stream": "rq", "wait": true])
        #expect(second["delivered"] == .int(2) && second["deadLettered"] == .int(0), "\(second)")
        let left = try c.call("uploader.deadLetters", ["stream": "rq"])["deadLetters"]?.arrayValue ?? []
        #expect(left.compactMap { $0["id"]?.stringValue } == ["r-1"])
        #expect(try server.log().compactMap { $0["status"]?.intValue } == [400, 200])
        // pylonctl's subcommands call the same methods.
        let listed = try ctl(h, ["dead-letters", "list", "rq"])
        #expect(listed.status == 0 && listed.out.contains(#""id":"r-1""#), "\(listed)")
        #expect(try ctl(h, ["dead-letters", "requeue"]).status == 64)
        let discarded = try ctl(h, ["dead-letters", "discard", "rq", "r-1"])
        #expect(discarded.status == 0 && discarded.out.contains(#""discarded":1"#), "\(discarded)")
        #expect(try c.call("uploader.deadLetters", ["stream": "rq"])["deadLetters"] == .array([]))
    }

    /// Runs pylonctl against `h`: its exit status and standard output.
    func ctl(_ h: TestHost, _ args: [String]) throws -> (status: Int32, out: String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylonctl")
        p.arguments = ["--socket", h.socket] + args
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    /// An expired proxy token (401), a refused one (403) or a redirect: the batch is kept and
    /// retried with backoff, shown in `status`, and delivered once the endpoint answers 2xx;
    /// nothing is set aside. (Before, each of them set the kiosk's whole batch aside.)
    @Test func credentialsRefusedAndRedirectsAreRetriedNotSetAside() throws {
        let server = try UploaderTestServer()
        try server.answer([401])
        let h = try host(server, config: ["retryInitialMs": 600_000, "retryMaxMs": 600_000])
        let c = try h.client()
        _ = try enqueue(c, "kiosk", records("k", 0..<2))
        _ = try c.call("uploader.flush", ["stream": "kiosk"])
        try waitUntil(timeout: 10) { try c.call("uploader.status")["streams"]?["kiosk"]?["attempts"] == .int(1) }
        let s = try c.call("uploader.status")["streams"]?["kiosk"]
        #expect(s?["lastResult"] == "retrying: HTTP 401 (credentials refused)", "\(String(describing: s))")
        #expect((s?["retryInMs"]?.intValue ?? 0) > 0 && s?["deadLetters"] == .int(0) && s?["pendingBatches"] == .int(1))
        // A flush skips the wait; the endpoint answers 403, then a redirect, then 200.
        try server.answer([403, 302])
        for expected in ["retrying: HTTP 403 (credentials refused)", "retrying: HTTP 302 (redirects are not followed)"] {
            _ = try c.call("uploader.flush", ["stream": "kiosk"])
            try waitUntil(timeout: 10) { try c.call("uploader.status")["streams"]?["kiosk"]?["lastResult"] == .string(expected) }
        }
        let r = try c.call("uploader.flush", ["stream": "kiosk", "wait": true])
        #expect(r["delivered"] == .int(2) && r["deadLettered"] == .int(0) && r["lastResult"] == "delivered 2 records", "\(r)")
        #expect(try server.log().compactMap { $0["status"]?.intValue } == [401, 403, 302, 200])
        #expect(try c.call("uploader.deadLetters", ["stream": "kiosk"])["deadLetters"] == .array([]))
    }
}
