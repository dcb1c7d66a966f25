import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// Issue 22 item 2: GTM's `_img` pixel is an HTTP GET of its URL, and the uploader makes it: a
/// `"delivery": "get"` stream (`gtm.pixels`) whose records each carry a `url`, requested one by
/// one, durably, under the stream's consent switch, only to its `allowedHosts`, with retry. A
/// local test server receives the GETs.
@Suite(.serialized) struct UploaderPixelTests {
    func host(_ server: UploaderTestServer, config extra: JSONObject = [:], allow: [UploaderTestServer] = []) throws -> TestHost {
        // Destinations are host and port: the servers' ports are named (a bare host is port 80).
        let hosts = ([server] + allow).map { JSON.string("127.0.0.1:\($0.port)") }
        var cfg: JSONObject = [
            "endpoint": .string(server.baseURL + "/v1/batches/{stream}"), "retryInitialMs": 100, "retryMaxMs": 2000,
            "streams": [
                "gtm.pixels": ["delivery": "get", "allowedHosts": .array(hosts), "consent": "gtm:hits", "intervalMs": 600_000]
            ],
        ]
        for (k, v) in extra { cfg[k] = v }
        let h = try TestHost(plugins: [
            [
                "name": "uploader", "exec": "pylon-uploader", "config": .object(cfg), "backoffInitialMs": 50,
                "heartbeatIntervalMs": 500, "heartbeatTimeoutMs": 5000,
            ]
        ])
        try h.waitForPlugin("uploader")
        return h
    }

    func pixel(_ c: SyncClient, _ id: String, _ url: String, owner: String? = nil) throws -> JSON {
        var data: JSONObject = ["kind": "pixel", "url": .string(url)]
        if let owner { data["owner"] = .string(owner) }
        return try c.call(
            "uploader.enqueue",
            ["stream": "gtm.pixels", "consent": "gtm:hits", "records": [["id": .string(id), "data": .object(data)]]])
    }

    func gets(_ server: UploaderTestServer) throws -> [String] {
        try server.log().filter { $0["method"] == "GET" }.compactMap { $0["path"]?.stringValue }
    }

    @Test func eachPixelRecordIsAGetOfItsURL() throws {
        let server = try UploaderTestServer()
        let h = try host(server)
        let c = try h.client()
        #expect(try pixel(c, "p1", server.baseURL + "/px?n=1&e=page_view")["accepted"] == .int(1))
        #expect(try pixel(c, "p2", server.baseURL + "/px?n=2")["accepted"] == .int(1))
        let r = try c.call("uploader.flush", ["stream": "gtm.pixels", "wait": true])
        #expect(r["delivered"] == .int(2) && r["deadLettered"] == .int(0), "\(r)")
        #expect(try gets(server) == ["/px?n=1&e=page_view", "/px?n=2"])
        #expect(try server.log().allSatisfy { $0["method"] == "GET" }, "no batch is POSTed for a GET stream")
        #expect(try c.call("uploader.status")["streams"]?["gtm.pixels"]?["delivery"] == "get")
    }

    /// Only http/https URLs whose host the stream allows, checked at the enqueue.
    @Test func urlsOutsideTheAllowedHostsAreRefusedAtTheEnqueue() throws {
        let server = try UploaderTestServer()
        let h = try host(server)
        let c = try h.client()
        // Another port of the allowed host is another destination (the issue's
        // `127.0.0.1:8850/v1/inspect/stats`), and so is the bare host's port 80.
        for url in [
            "http://evil.example/x", "ftp://127.0.0.1/x", "http://user:pw@127.0.0.1/x", "127.0.0.1/x",
            "http://127.0.0.1:8850/v1/inspect/stats", "http://127.0.0.1/x",
        ] {
            do {
                _ = try pixel(c, "bad", url)
                Issue.record("\(url) accepted")
            } catch let e as RPCError {
                #expect(e.code == -32602 && e.message.hasPrefix("records[0].data.url is not allowed"), "\(url): \(e)")
            }
        }
        do {
            _ = try c.call("uploader.enqueue", ["stream": "gtm.pixels", "records": [["id": "nourl", "data": ["kind": "pixel"]]]])
            Issue.record("a record without url accepted")
        } catch let e as RPCError {
            #expect(e.code == -32602 && e.message.contains("data.url is required"))
        }
        #expect(try server.log().isEmpty)
    }

    /// A 5xx is retried; a redirect counts as delivered (not followed, not requested again); a
    /// 4xx sets the pixel aside.
    @Test func pixelsAreRetriedOnServerErrorsAndSetAsideOn4xx() throws {
        let server = try UploaderTestServer()
        try server.answer([503, 302, 404])
        let h = try host(server)
        let c = try h.client()
        _ = try pixel(c, "p3", server.baseURL + "/px?n=3")
        let r = try c.call("uploader.flush", ["stream": "gtm.pixels", "wait": true])
        #expect(r["delivered"] == .int(1) && r["deadLettered"] == .int(0), "\(r)")
        _ = try pixel(c, "p4", server.baseURL + "/px?n=4")
        let r4 = try c.call("uploader.flush", ["stream": "gtm.pixels", "wait": true])
        #expect(r4["delivered"] == .int(0) && r4["deadLettered"] == .int(1), "\(r4)")
        #expect(try server.log().compactMap { $0["status"]?.intValue } == [503, 302, 404])
        #expect(try gets(server) == ["/px?n=3", "/px?n=3", "/px?n=4"])
        let dead = try c.call("uploader.deadLetters", ["stream": "gtm.pixels"])["deadLetters"]?.arrayValue ?? []
        #expect(dead.map { $0["id"] } == [.string("p4")] && dead.first?["status"] == .int(404))
    }

    /// A pixel still queued when its switch is denied is purged without its GET: requesting it
    /// after the denial would hand the hit to the URL's host.
    @Test func aDeniedSwitchPurgesQueuedPixelsWithoutRequestingThem() throws {
        let server = try UploaderTestServer()
        try server.answer([503])
        let h = try host(server, config: ["retryInitialMs": 600_000, "retryMaxMs": 600_000])
        let c = try h.client()
        _ = try pixel(c, "p5", server.baseURL + "/px?n=5")
        _ = try c.call("uploader.flush", ["stream": "gtm.pixels"])
        try waitUntil(timeout: 10) { try c.call("uploader.status")["streams"]?["gtm.pixels"]?["attempts"] == .int(1) }
        _ = try c.call("consent.set", ["key": "gtm:hits", "granted": false])
        try waitUntil(timeout: 10) {
            let st = try c.call("uploader.status")["streams"]?["gtm.pixels"]
            return st?["pendingBatches"] == .int(0) && st?["queued"] == .int(0)
        }
        #expect(try gets(server) == ["/px?n=5"], "only the attempt made before the denial")
        #expect(throws: RPCError.self) { try pixel(c, "p6", server.baseURL + "/px?n=6") }
    }

    /// End to end: a container's `_img` tag fires in the gtm plugin, which queues the pixel on
    /// `gtm.pixels`; the uploader GETs its URL from the test server.
    @Test func aGTMPixelTagReachesItsURL() throws {
        let b = try TestBackend()
        let server = try UploaderTestServer()
        let res = gtmResource(
            [:], macros: [["function": "_e", "instance_name": "event"]],
            predicates: [["function": "_eq", "arg0": ["macro", 0], "arg1": "purchase"]],
            tags: [["function": "_img", "url": .string(server.baseURL + "/px?e=purchase")]],
            rules: [[["if", 0], ["add", 0]]])
        try b.publishContainer("GTM-PX", res)
        let h = try TestHost(plugins: [
            TestHost.uploader(
                b,
                config: [
                    "streams": [
                        "gtm.pixels": [
                            "delivery": "get", "allowedHosts": [.string("127.0.0.1:\(server.port)")], "consent": "gtm:hits",
                            "intervalMs": 0,
                        ]
                    ]
                ]),
            [
                "name": "gtm", "exec": "pylon-gtm", "backoffInitialMs": 50,
                "config": [
                    "backend": .string(b.baseURL), "credentialFile": .string(b.credentialFile),
                    "defaultsDir": .string(try defaultsDir([:])), "fetchTimeoutMs": 3000,
                ],
            ],
        ])
        let c = try h.client()
        _ = try c.open("GTM-PX")
        _ = try c.call("gtm.push", ["data": ["event": "purchase"]])
        try waitUntil(timeout: 10) { try gets(server) == ["/px?e=purchase"] }
        _ = try c.call("uploader.flush", ["stream": "gtm.pixels", "wait": true])
        #expect(try c.call("uploader.status")["streams"]?["gtm.pixels"]?["delivered"] == .int(1))
        #expect(try b.records("gtm.hits").isEmpty, "a pixel is not an analytics hit")
    }

    /// Issue 32 item 4: uid 65534's pixel to a destination that keeps failing (503 on every
    /// request) holds only its own lane. uid 1000's pixel to a healthy destination arrives while
    /// the failing one is still being retried. (Before the lanes: one GET in flight for the
    /// whole stream, retried forever, held every other pixel behind it.)
    @Test func aFailingDestinationHoldsOnlyItsOwnPixels() throws {
        let failing = try UploaderTestServer()
        try failing.answer([], then: 503)
        let healthy = try UploaderTestServer()
        let h = try host(failing, config: ["pixels": ["maxAttempts": 1000]], allow: [healthy])
        let c = try h.client()
        _ = try pixel(c, "bad", failing.baseURL + "/v1/inspect/stats", owner: "uid:65534")
        _ = try c.call("uploader.flush", ["stream": "gtm.pixels"])
        // The failing pixel is in its retries (two requests seen) before the healthy one is queued.
        try waitUntil(timeout: 10) { try gets(failing).count >= 2 }
        _ = try pixel(c, "good", healthy.baseURL + "/px?uid=1000", owner: "uid:1000")
        _ = try c.call("uploader.flush", ["stream": "gtm.pixels"])
        try waitUntil(timeout: 10) { try gets(healthy) == ["/px?uid=1000"] }
        // ... while the failing one is still failing: queued, not given up, and requested again.
        let seen = try gets(failing).count
        try waitUntil(timeout: 10) { try gets(failing).count > seen }
        let st = try c.call("uploader.status")["streams"]?["gtm.pixels"]
        #expect(st?["pendingBatches"] == .int(1) && st?["deadLetters"] == .int(0) && st?["delivered"] == .int(1), "\(st ?? .null)")
        #expect(try failing.log().allSatisfy { $0["status"] == .int(503) })
    }

    /// A pixel that keeps failing is dead-lettered after `pixels.maxAttempts` tries, with its
    /// last status; a 401 (or 403) is dead-lettered at once (a pixel carries no credentials).
    @Test func aPixelThatKeepsFailingIsDeadLettered() throws {
        let server = try UploaderTestServer()
        try server.answer([503, 503, 503, 401])
        let h = try host(server, config: ["pixels": ["maxAttempts": 3]])
        let c = try h.client()
        _ = try pixel(c, "p7", server.baseURL + "/px?n=7", owner: "uid:1000")
        let r = try c.call("uploader.flush", ["stream": "gtm.pixels", "wait": true])
        #expect(r["delivered"] == .int(0) && r["deadLettered"] == .int(1), "\(r)")
        _ = try pixel(c, "p8", server.baseURL + "/px?n=8", owner: "uid:1000")
        let r8 = try c.call("uploader.flush", ["stream": "gtm.pixels", "wait": true])
        #expect(r8["deadLettered"] == .int(1), "\(r8)")
        #expect(try gets(server) == ["/px?n=7", "/px?n=7", "/px?n=7", "/px?n=8"])
        let dead = try c.call("uploader.deadLetters", ["stream": "gtm.pixels"])["deadLetters"]?.arrayValue ?? []
        #expect(dead.map { $0["id"] } == [.string("p7"), .string("p8")], "\(dead)")
        #expect(dead.map { $0["status"] } == [.int(503), .int(401)], "\(dead)")
        #expect(dead.first?["reason"]?.stringValue?.hasPrefix("gave up after 3 attempts") == true, "\(dead)")
    }

    /// Through an uploader restart: a pixel queued and failing before it is found again from disk
    /// and requested at once (its lane starts afresh), and another owner's pixel queued behind it
    /// still goes while it keeps failing.
    @Test func afterARestartTheFailingPixelHoldsOnlyItsOwnLane() throws {
        let failing = try UploaderTestServer()
        try failing.answer([], then: 503)
        let healthy = try UploaderTestServer()
        // A first retry 10 min away: after its first failure the pixel waits for that, or a restart.
        let h = try host(failing, config: ["retryInitialMs": 600_000, "retryMaxMs": 600_000], allow: [healthy])
        let c = try h.client()
        _ = try pixel(c, "bad", failing.baseURL + "/px?uid=65534", owner: "uid:65534")
        _ = try c.call("uploader.flush", ["stream": "gtm.pixels"])
        try waitUntil(timeout: 10) { try gets(failing).count == 1 }
        _ = try c.call("bus.restart", ["plugin": "uploader"])
        try h.waitForPlugin("uploader", restartsAtLeast: 1)
        try waitUntil(timeout: 10) { try gets(failing).count == 2 }
        _ = try pixel(c, "good", healthy.baseURL + "/px?uid=1000", owner: "uid:1000")
        _ = try c.call("uploader.flush", ["stream": "gtm.pixels"])
        try waitUntil(timeout: 10) { try gets(healthy) == ["/px?uid=1000"] }
        let st = try c.call("uploader.status")["streams"]?["gtm.pixels"]
        #expect(st?["pendingBatches"] == .int(1) && st?["pixels"]?["lanes"] == .int(1) && st?["deadLetters"] == .int(0), "\(st ?? .null)")
    }

    /// The issue's attack end to end, as unprivileged uids: uid 65534 pushes a data-layer pixel
    /// URL at the backend's own port (refused at the enqueue: the allowed bare host is port 80
    /// only) and one at a destination that answers 503 to every GET; while that one is retried,
    /// uid 4242's pixel to a healthy destination arrives.
    @Test func oneUidsFailingPixelDoesNotHoldAnotherUidsPixels() throws {
        let b = try TestBackend()
        let failing = try UploaderTestServer()
        try failing.answer([], then: 503)
        let healthy = try UploaderTestServer()
        let res = gtmResource(
            [:],
            macros: [["function": "_e", "instance_name": "event"], ["function": "_v", "instance_name": "pixelUrl", "name": "pixelUrl"]],
            predicates: [["function": "_eq", "arg0": ["macro", 0], "arg1": "px"]],
            tags: [["function": "_img", "url": ["macro", 1]]], rules: [[["if", 0], ["add", 0]]])
        try b.publishContainer("GTM-PX", res)
        let allowed: [JSON] = ["127.0.0.1", .string("127.0.0.1:\(failing.port)"), .string("127.0.0.1:\(healthy.port)")]
        let h = try TestHost.open(plugins: [
            TestHost.uploader(
                b,
                config: [
                    "streams": [
                        "gtm.pixels": [
                            "delivery": "get", "allowedHosts": .array(allowed), "consent": "gtm:hits", "intervalMs": 0,
                        ]
                    ]
                ]),
            [
                "name": "gtm", "exec": "pylon-gtm", "backoffInitialMs": 50,
                "config": [
                    "backend": .string(b.baseURL), "credentialFile": .string(b.credentialFile),
                    "defaultsDir": .string(try defaultsDir([:])), "fetchTimeoutMs": 3000,
                ],
            ],
        ])
        let attackerRelay = try UidClient(h, uid: 65534)
        let victimRelay = try UidClient(h, uid: 4242)
        defer { withExtendedLifetime((attackerRelay, victimRelay)) {} }
        let attacker = attackerRelay.client
        let victim = victimRelay.client
        #expect(try attacker.open("GTM-PX")["source"] == "network")
        let inspect = b.baseURL + "/v1/inspect/stats"
        _ = try attacker.call("gtm.push", ["data": ["event": "px", "pixelUrl": .string(inspect)]])
        _ = try attacker.call("gtm.push", ["data": ["event": "px", "pixelUrl": .string(failing.baseURL + "/px?uid=65534")]])
        try waitUntil(timeout: 10) { try gets(failing).count >= 2 }
        #expect(try victim.open("GTM-PX")["source"] == "network")
        _ = try victim.call("gtm.push", ["data": ["event": "px", "pixelUrl": .string(healthy.baseURL + "/px?uid=4242")]])
        try waitUntil(timeout: 10) { try gets(healthy) == ["/px?uid=4242"] }
        let seen = try gets(failing).count
        try waitUntil(timeout: 10) { try gets(failing).count > seen }
        let root = try h.client()
        let lines = try root.call("gtm.logLines", ["uid": 65534, "limit": 100])["lines"]?.arrayValue ?? []
        #expect(
            lines.contains {
                ($0["message"]?.stringValue ?? "").contains("127.0.0.1:\(URL(string: b.baseURL)?.port ?? 0) is not in allowedHosts")
            },
            "the pixel to the backend's port was refused at the enqueue: \(lines)")
        #expect(try gets(failing).allSatisfy { $0 == "/px?uid=65534" })
    }
}
