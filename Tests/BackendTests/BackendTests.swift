import Foundation
import PylonClientKit
import PylonStore
import TestSupport
import Testing

/// The reference backend as a black box: the real binary on a free loopback port, driven by a
/// raw-socket HTTP/1.1 client.
@Suite(.serialized) struct BackendTests {
    // MARK: Ingest and inspection

    @Test func healthAndUnknownRoutes() throws {
        let b = try BackendProcess()
        let h = try b.request("GET", "/healthz")
        #expect(h.status == 200)
        #expect(h.headers["content-type"] == "application/json")
        #expect(try h.json() == ["ok": true])

        let nf = try b.request("GET", "/v2/nothing")
        #expect(nf.status == 404)
        #expect(try nf.json()["code"] == "not_found")

        let na = try b.request("GET", "/v1/batches/s")
        #expect(na.status == 405)
        #expect(na.headers["allow"] == "POST")
        #expect(try na.json()["code"] == "method_not_allowed")
        #expect(try b.request("PUT", "/v1/faults").headers["allow"] == "GET, POST, DELETE")
    }

    @Test(arguments: StoreKind.allCases) func ingestThenInspect(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let r = try b.postBatch("ma.events", key: "k1", batchBody(key: "k1", stream: "ma.events", ids: ["a", "b", "c"]))
        #expect(r.status == 200)
        #expect(try r.json() == ["accepted": 3, "duplicates": 0, "duplicateBatch": false])

        let s = try b.get("/v1/inspect/streams/ma.events")
        #expect(s == ["stream": "ma.events", "records": 3, "batches": 1, "duplicateRecords": 0, "duplicateBatches": 0])
        #expect(try b.get("/v1/inspect/streams/other")["records"] == 0)

        let page = try b.get("/v1/inspect/streams/ma.events/records?limit=2")
        let recs = try #require(page["records"]?.arrayValue)
        #expect(recs.map { $0["id"] } == ["a", "b"])
        #expect(recs[0]["ts"] == .int(1_700_000_000_000))
        #expect(recs[0]["data"] == ["name": "event-a", "n": 1])
        let next = try #require(page["next"]?.intValue)
        let rest = try b.get("/v1/inspect/streams/ma.events/records?after=\(next)")
        #expect(rest["records"]?.arrayValue?.map { $0["id"] } == ["c"])

        let stats = try b.get("/v1/inspect/stats")
        #expect(stats["batches"] == 1)
        #expect(stats["records"] == 3)
        #expect(stats["requestsByPath"]?["/v1/batches/ma.events"] == 1)
        #expect((stats["requests"]?.intValue ?? 0) >= 5)
    }

    @Test(arguments: StoreKind.allCases) func duplicateBatchKeyStoresNothing(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let body = batchBody(key: "same", stream: "s", ids: ["1", "2"])
        #expect(try b.postBatch("s", key: "same", body).json()["accepted"] == 2)
        let again = try b.postBatch("s", key: "same", body)
        #expect(again.status == 200)
        #expect(try again.json() == ["accepted": 0, "duplicates": 2, "duplicateBatch": true])
        let s = try b.get("/v1/inspect/streams/s")
        #expect(s["records"] == 2)
        #expect(s["batches"] == 1)
        #expect(s["duplicateBatches"] == 1)
        #expect(try b.get("/v1/inspect/stats")["duplicateBatches"] == 1)
    }

    @Test(arguments: StoreKind.allCases) func duplicateRecordIdsAreDroppedAcrossAndWithinBatches(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        #expect(try b.postBatch("s", key: "b1", batchBody(key: "b1", stream: "s", ids: ["x", "y"])).json()["accepted"] == 2)
        let r = try b.postBatch("s", key: "b2", batchBody(key: "b2", stream: "s", ids: ["y", "z", "z"])).json()
        #expect(r == ["accepted": 1, "duplicates": 2, "duplicateBatch": false])
        // The same id in another stream is a different record.
        #expect(try b.postBatch("t", key: "b3", batchBody(key: "b3", stream: "t", ids: ["x"])).json()["accepted"] == 1)
        let s = try b.get("/v1/inspect/streams/s")
        #expect(s["records"] == 3)
        #expect(s["batches"] == 2)
        #expect(s["duplicateRecords"] == 2)
        let ids = try b.get("/v1/inspect/streams/s/records")["records"]?.arrayValue?.map { $0["id"] }
        #expect(ids == ["x", "y", "z"])
    }

    @Test(arguments: StoreKind.allCases) func gzipBody(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let json = batchBody(key: "gz", stream: "s", ids: (0..<200).map { "r\($0)" })
        let zipped = try Gzip.compress(Array(json.serialized.utf8))
        let r = try b.request("POST", "/v1/batches/s", headers: [("Idempotency-Key", "gz"), ("Content-Encoding", "gzip")], body: zipped)
        #expect(r.status == 200)
        #expect(try r.json()["accepted"] == 200)

        let junk = try b.request(
            "POST", "/v1/batches/s", headers: [("Idempotency-Key", "gz2"), ("Content-Encoding", "gzip")],
            body: Array("not gzip".utf8))
        #expect(junk.status == 400)
        let br = try b.request("POST", "/v1/batches/s", headers: [("Idempotency-Key", "br"), ("Content-Encoding", "br")], body: [1])
        #expect(br.status == 415)
        #expect(try br.json()["code"] == "unsupported_encoding")
    }

    @Test func gzipBombOverTheDecompressedLimitIs413() throws {
        let b = try BackendProcess(["--max-body", "65536"])
        let zipped = try Gzip.compress([UInt8](repeating: 0x20, count: 1 << 20))  // ~1 KiB compressed
        #expect(zipped.count < 65536)
        let r = try b.request("POST", "/v1/batches/s", headers: [("Idempotency-Key", "bomb"), ("Content-Encoding", "gzip")], body: zipped)
        #expect(r.status == 413)
        #expect(try r.json()["code"] == "payload_too_large")
    }

    @Test(arguments: StoreKind.allCases) func chunkedBodyIsAccepted(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let c = try b.client()
        let body = Array(batchBody(key: "ch", stream: "s", ids: ["1", "2"]).serialized.utf8)
        let half = body.count / 2
        var msg = Array(
            "POST /v1/batches/s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(TestCredentials.deviceKey)\r\nIdempotency-Key: ch\r\nTransfer-Encoding: chunked\r\n\r\n"
                .utf8)
        for part in [body[..<half], body[half...]] {
            msg += Array(String(part.count, radix: 16).utf8) + [13, 10] + part + [13, 10]
        }
        msg += Array("0\r\n\r\n".utf8)
        try c.send(msg)
        let r = try #require(try c.readResponse())
        #expect(r.status == 200)
        #expect(try r.json()["accepted"] == 2)
    }

    @Test(arguments: StoreKind.allCases) func resetClearsEverything(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        _ = try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["1"]))
        try b.setFaults(["latencyMs": 1])
        #expect(try b.request("POST", "/v1/admin/reset").status == 200)
        #expect(try b.get("/v1/inspect/streams/s")["records"] == 0)
        #expect(try b.get("/v1/faults")["latencyMs"] == 0)
        // The key is forgotten too: the same batch is new again.
        #expect(try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["1"])).json()["duplicateBatch"] == false)
    }

    @Test(arguments: StoreKind.allCases) func dataSurvivesARestartWithADatabaseFile(_ store: StoreKind) throws {
        let dir = NSTemporaryDirectory() + "pylon-backend-db-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let db = try store.databaseArguments(sqliteFile: dir + "/backend.sqlite")
        do {
            let b = try BackendProcess(database: db)
            #expect(try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["1", "2"])).status == 200)
            #expect(b.stop() == 0)
        }
        let b = try BackendProcess(database: db)
        #expect(try b.get("/v1/inspect/streams/s")["records"] == 2)
        #expect(try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["1", "2"])).json()["duplicateBatch"] == true)
    }

    // MARK: Validation

    @Test(arguments: StoreKind.allCases) func invalidBatchesAre400AndStoreNothing(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let noKey = try b.postBatch("s", key: nil, batchBody(key: "k", stream: "s", ids: ["1"]))
        #expect(noKey.status == 400)
        #expect(try noKey.json()["code"] == "missing_idempotency_key")

        let bad = try b.request("POST", "/v1/batches/s", headers: [("Idempotency-Key", "k")], body: Array(#"{"records":[{"id":"1""#.utf8))
        #expect(bad.status == 400)
        #expect(try bad.json()["code"] == "invalid_json")

        let shapes: [JSON] = [
            ["records": "nope"],
            ["records": [["id": 5, "ts": 1]]],
            ["records": [["id": "a"]]],
            ["records": [["id": "a", "ts": -1]]],
            ["records": [["id": "", "ts": 1]]],
            ["batch": "other", "records": []],
            ["stream": "other", "records": []],
            ["batch": "k\u{0}junk", "records": []],  // a NUL must not cut the key short to "k"
            ["records": [["id": "a\u{0}b", "ts": 1]]],
            [1, 2],
        ]
        for shape in shapes {
            let r = try b.postBatch("s", key: "k", shape)
            #expect(r.status == 400, "\(shape.serialized)")
            #expect(try r.json()["code"] == "invalid_batch", "\(shape.serialized)")
        }
        let s = try b.get("/v1/inspect/streams/s")
        #expect(s["records"] == 0)
        #expect(s["batches"] == 0)
        // None of them used up the key.
        #expect(try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["1"])).json()["accepted"] == 1)
    }

    @Test func oversizeBodyIs413() throws {
        let b = try BackendProcess(["--max-body", "1024"])
        let c = try b.client()
        let r = try c.request("POST", "/v1/batches/s", headers: [("Idempotency-Key", "big")], body: [UInt8](repeating: 0x20, count: 4096))
        #expect(r.status == 413)
        #expect(r.headers["connection"] == "close")
        #expect(try r.json()["code"] == "payload_too_large")
        #expect(try c.isClosedByPeer())
        // The limit also holds for chunked bodies, which declare no length.
        let c2 = try b.client()
        try c2.send("POST /v1/batches/s HTTP/1.1\r\nHost: x\r\nIdempotency-Key: big2\r\nTransfer-Encoding: chunked\r\n\r\n")
        try c2.send("800\r\n" + String(repeating: " ", count: 2048) + "\r\n")
        #expect(try c2.readResponse()?.status == 413)
        #expect(try b.get("/v1/inspect/stats")["batches"] == 0)
    }

    @Test func largeBodyWithExpectContinue() throws {
        let b = try BackendProcess()
        let c = try b.client()
        let body = Array(batchBody(key: "e", stream: "s", ids: (0..<500).map { "id-\($0)" }).serialized.utf8)
        try c.send(
            "POST /v1/batches/s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \(TestCredentials.deviceKey)\r\nIdempotency-Key: e\r\nExpect: 100-continue\r\nContent-Length: \(body.count)\r\n\r\n"
        )
        let interim = try #require(try c.readResponse())
        #expect(interim.status == 100)
        try c.send(body)
        let r = try #require(try c.readResponse())
        #expect(r.status == 200)
        #expect(try r.json()["accepted"] == 500)
    }

    // MARK: HTTP framing

    @Test func malformedHTTPIs400AndCloses() throws {
        let b = try BackendProcess()
        let c = try b.client()
        try c.send("GARBAGE\r\n\r\n")
        let r = try #require(try c.readResponse())
        #expect(r.status == 400)
        #expect(try r.json()["code"] == "malformed_http")
        #expect(try c.isClosedByPeer())
        // The server is fine afterwards.
        #expect(try b.request("GET", "/healthz").status == 200)
    }

    @Test func oversizeHeadersAre431() throws {
        let b = try BackendProcess()
        let c = try b.client()
        let r = try c.request("GET", "/healthz", headers: [("X-Big", String(repeating: "a", count: 70_000))])
        #expect(r.status == 431)
        #expect(try r.json()["code"] == "header_too_large")
        let many = (0..<150).map { ("X-H\($0)", "v") }
        #expect(try b.client().request("GET", "/healthz", headers: many).status == 431)
    }

    @Test func pipelinedKeepAliveRequestsAreAnsweredInOrder() throws {
        let b = try BackendProcess()
        let c = try b.client()
        var blob: [UInt8] = []
        for i in 0..<20 {
            let key = "p\(i)"
            blob += RawHTTPClient.message(
                "POST", "/v1/batches/s", headers: [("Idempotency-Key", key)],
                body: Array(batchBody(key: key, stream: "s", ids: ["r\(i)", "r\(i + 1)"]).serialized.utf8))
            blob += RawHTTPClient.message("GET", "/v1/inspect/streams/s")
        }
        try c.send(blob)
        for i in 0..<20 {
            let post = try #require(try c.readResponse())
            #expect(post.status == 200)
            // Each batch repeats one id of the previous one.
            #expect(try post.json()["accepted"] == (i == 0 ? 2 : 1))
            let inspect = try #require(try c.readResponse())
            #expect(try inspect.json()["records"] == .int(Int64(i + 2)))
        }
        // Still open afterwards.
        #expect(try c.request("GET", "/healthz").status == 200)
    }

    @Test func headResponsesCarryNoBody() throws {
        let b = try BackendProcess()
        let c = try b.client()
        try c.send(RawHTTPClient.message("HEAD", "/healthz") + RawHTTPClient.message("GET", "/healthz"))
        // Were the 405's body sent, it would be read as the start of the next response.
        let head = try #require(try c.readResponse(toHEAD: true))
        #expect(head.status == 405)
        #expect(head.headers["content-length"] != "0")
        let get = try #require(try c.readResponse())
        #expect(try get.json() == ["ok": true])
    }

    /// Descriptors `partialRequestsDoNotExhaustTheDefaultConnectionLimit` needs: 1024 + a few here
    /// and in the backend (which inherits the limit).
    static let descriptorsForTheConnectionLimitTest: rlim_t = 1200
    static var hardDescriptorLimit: rlim_t {
        var lim = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &lim)
        return lim.rlim_max
    }

    /// Skipped (visibly, with the reason) where the hard descriptor limit is below what it needs.
    @Test(
        .enabled(
            if: BackendTests.hardDescriptorLimit >= BackendTests.descriptorsForTheConnectionLimitTest,
            "needs a hard RLIMIT_NOFILE of at least \(BackendTests.descriptorsForTheConnectionLimitTest)"))
    func partialRequestsDoNotExhaustTheDefaultConnectionLimit() throws {
        var lim = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &lim)
        lim.rlim_cur = max(lim.rlim_cur, Self.descriptorsForTheConnectionLimitTest)
        setrlimit(Int32(RLIMIT_NOFILE.rawValue), &lim)
        let b = try BackendProcess()
        var open: [RawHTTPClient] = []
        for _ in 0..<1024 {
            let c = try b.client()
            try c.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")  // never finished
            open.append(c)
        }
        // Used to be 503 `too_many_connections` for everyone else: now the least recently
        // active partial connection makes room (the limit itself: BackendHardeningTests).
        #expect(try b.request("GET", "/healthz").status == 200)
        #expect(try b.request("GET", "/healthz").status == 200)
        open.removeAll()
        try waitUntil(timeout: 5) { (try? b.request("GET", "/healthz").status) == 200 }
    }

    @Test func connectionCloseIsHonoured() throws {
        let b = try BackendProcess()
        let c = try b.client()
        // Anything after a `Connection: close` request is ignored.
        try c.send(RawHTTPClient.message("GET", "/healthz", headers: [("Connection", "close")]) + RawHTTPClient.message("GET", "/healthz"))
        let r = try #require(try c.readResponse())
        #expect(r.headers["connection"] == "close")
        #expect(try c.isClosedByPeer())
        #expect(try c.readResponse() == nil)
    }

    // MARK: Fault injection

    @Test(arguments: StoreKind.allCases) func failNextWithRetryAfterStoresNothing(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        try b.setFaults(["failNext": 2, "status": 429, "retryAfter": 7])
        let body = batchBody(key: "f", stream: "s", ids: ["1"])
        for _ in 0..<2 {
            let r = try b.postBatch("s", key: "f", body)
            #expect(r.status == 429)
            #expect(r.headers["retry-after"] == "7")
            #expect(try r.json()["code"] == "injected_fault")
            // Inspection is never faulted.
            #expect(try b.get("/v1/inspect/streams/s")["records"] == 0)
        }
        let ok = try b.postBatch("s", key: "f", body)
        #expect(ok.status == 200)
        #expect(try ok.json() == ["accepted": 1, "duplicates": 0, "duplicateBatch": false])
        #expect(try b.get("/v1/inspect/stats")["faultsInjected"] == 2)
        #expect(try b.get("/v1/faults")["failNext"] == 0)

        try b.setFaults(["failNext": 1])  // merged: status 429 and retryAfter stay
        #expect(try b.request("GET", "/healthz").status == 200)  // exempt
        let r = try b.postBatch("s", key: "g", batchBody(key: "g", stream: "s", ids: ["2"]))
        #expect(r.status == 429)
        #expect(try b.request("DELETE", "/v1/faults").status == 200)
        #expect(
            try b.get("/v1/faults") == [
                "failNext": 0, "status": 503, "retryAfter": .null, "latencyMs": 0, "dropNext": 0, "holdIngest": false,
            ])
    }

    @Test func invalidFaultSettingsAreRejected() throws {
        let b = try BackendProcess()
        for bad: JSON in [["failNext": -1], ["status": 200], ["latencyMs": "x"], ["bogus": 1], [1]] {
            let r = try b.request("POST", "/v1/faults", body: Array(bad.serialized.utf8))
            #expect(r.status == 400, "\(bad.serialized)")
        }
        #expect(try b.get("/v1/faults")["failNext"] == 0)
    }

    @Test func dropNextClosesWithoutAResponse() throws {
        let b = try BackendProcess()
        try b.setFaults(["dropNext": 1])
        let c = try b.client()
        try c.send(
            RawHTTPClient.message(
                "POST", "/v1/batches/s", headers: [("Idempotency-Key", "d")],
                body: Array(batchBody(key: "d", stream: "s", ids: ["1"]).serialized.utf8)))
        #expect(try c.readResponse() == nil)
        #expect(try b.get("/v1/inspect/streams/s")["records"] == 0)
        #expect(try b.postBatch("s", key: "d", batchBody(key: "d", stream: "s", ids: ["1"])).status == 200)
        #expect(try b.get("/v1/inspect/stats")["faultsInjected"] == 1)
    }

    @Test func latencyDelaysMatchingResponsesUntilCleared() throws {
        let b = try BackendProcess()
        try b.setFaults(["latencyMs": 300])
        var t0 = Date()
        #expect(try b.postBatch("s", key: "l", batchBody(key: "l", stream: "s", ids: ["1"])).status == 200)
        #expect(Date().timeIntervalSince(t0) >= 0.29)  // a lower bound: fails only if not delayed

        // Pipelined behind a delayed response, answers keep their order.
        let c = try b.client()
        try c.send(RawHTTPClient.message("GET", "/nothing-here") + RawHTTPClient.message("GET", "/healthz"))
        t0 = Date()
        #expect(try c.readResponse()?.status == 404)
        #expect(try c.readResponse()?.status == 200)
        #expect(Date().timeIntervalSince(t0) >= 0.25)

        // From here a delayed response would take 60 s, six times the client's 10 s read
        // timeout: an answer at all shows it was not delayed (no upper bound on the clock).
        try b.setFaults(["latencyMs": 60_000])
        #expect(try b.request("GET", "/healthz").status == 200)  // exempt
        // The server keeps serving other connections while one response is held.
        let slow = try b.client()
        try slow.send(RawHTTPClient.message("GET", "/slow"))
        #expect(try b.request("GET", "/v1/inspect/stats").status == 200)
        #expect(try b.request("DELETE", "/v1/faults").status == 200)
        // Cleared: answered at once.
        #expect(try b.postBatch("s", key: "l2", batchBody(key: "l2", stream: "s", ids: ["2"])).status == 200)
        _ = slow
    }

    // MARK: Process

    @Test func sigtermExitsCleanly() throws {
        let b = try BackendProcess()
        let idle = try b.client()  // an open keep-alive connection does not hold up the exit
        #expect(try idle.request("GET", "/healthz").status == 200)
        #expect(b.stop() == 0)
        #expect(b.logText.contains("msg=stopped"))
    }

    @Test func badArgumentsExit2() throws {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylon-backend")
        p.arguments = ["--listen", "nonsense"]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        p.waitUntilExit()
        #expect(p.terminationStatus == 2)
    }
}
