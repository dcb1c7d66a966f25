import Foundation
import PylonClientKit
import TestSupport
import Testing

/// The console's data API on a real backend: event search, live tail, users, erasure, push
/// history, analytics, privacy and retention (docs/backend-openapi.yaml), on SQLite and
/// PostgreSQL.
@Suite(.serialized) struct ConsoleDataTests {
    /// An MA event record as the MA plugin writes it.
    static func event(_ id: String, _ name: String, euid: String?, time: Int64, props: JSON = ["n": 1]) -> JSON {
        [
            "id": .string(id), "ts": .int(time),
            "data": ["event": .string(name), "time": .int(time), "euid": euid.map(JSON.string) ?? .null, "properties": props],
        ]
    }

    static func post(_ b: BackendProcess, app: String, key: String, _ records: [JSON]) throws {
        let body: JSON = ["batch": .string(key), "stream": .string("ma.\(app)"), "records": .array(records)]
        let r = try b.postBatch("ma.\(app)", key: key, body)
        guard r.status == 200 else { throw TestFailure(description: "batch \(key): \(r.status) \(r.text)") }
    }

    /// Every page of a search, following `nextCursor`.
    static func walk(_ b: BackendProcess, _ query: String) throws -> [JSON] {
        var out: [JSON] = []
        var cursor: String?
        for _ in 0..<1000 {
            let target = "/v1/admin/events?" + query + (cursor.map { "&cursor=" + $0 } ?? "")
            let page = try b.get(target)
            out += page["items"]?.arrayValue ?? []
            guard let next = page["nextCursor"]?.stringValue else { return out }
            cursor = next
        }
        throw TestFailure(description: "the cursor never ended")
    }

    @Test(arguments: StoreKind.allCases) func searchFiltersAndTheCursorWalksEachEventOnce(_ kind: StoreKind) throws {
        let b = try BackendProcess(store: kind)
        let user = try b.ma("start", ["deviceId": "d1", "identity": ["user_id": "u-1"]], app: "shop")
        let e1 = try #require(user["euid"]?.stringValue)
        let t0: Int64 = 1_760_000_000_000
        var records: [JSON] = []
        for i in 0..<30 {
            records.append(
                ConsoleDataTests.event(
                    "r\(i)", ["open", "buy", "<img src=x onerror=alert(1)>"][i % 3], euid: i % 2 == 0 ? e1 : "other-euid",
                    time: t0 + Int64(i) * 1000))
        }
        try ConsoleDataTests.post(b, app: "shop", key: "k1", Array(records[0..<20]))
        try ConsoleDataTests.post(b, app: "shop", key: "k2", Array(records[20...]))
        // Five of the records again with a new one (another key): each stored and indexed once.
        try ConsoleDataTests.post(
            b, app: "shop", key: "k3",
            Array(records[0..<5]) + [ConsoleDataTests.event("late", "open", euid: "other-euid", time: t0 + 7_200_000)])
        try ConsoleDataTests.post(b, app: "other", key: "k4", [ConsoleDataTests.event("x", "open", euid: nil, time: t0)])

        let all = try ConsoleDataTests.walk(b, "appKey=shop&limit=7")
        #expect(all.count == 31)
        #expect(Set(all.compactMap { $0["id"]?.intValue }).count == 31)
        let times = all.compactMap { $0["timeMs"]?.intValue }
        #expect(times == times.sorted(by: >))
        #expect(times.first == t0 + 7_200_000)

        let buys = try ConsoleDataTests.walk(b, "appKey=shop&event=buy&limit=4")
        #expect(buys.count == 10)
        #expect(buys.allSatisfy { $0["event"] == "buy" && $0["appKey"] == "shop" && $0["stream"] == "ma.shop" })
        let hostile = try ConsoleDataTests.walk(b, "appKey=shop&event=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")
        #expect(hostile.count == 10)

        let mine = try ConsoleDataTests.walk(b, "appKey=shop&user=u-1&limit=6")
        #expect(mine.count == 15)
        #expect(mine.allSatisfy { $0["euid"] == .string(e1) && $0["userId"] == "u-1" })
        #expect(try ConsoleDataTests.walk(b, "appKey=shop&euid=other-euid").count == 16)
        #expect(try ConsoleDataTests.walk(b, "appKey=shop&user=nobody").isEmpty)

        let window = try ConsoleDataTests.walk(b, "appKey=shop&fromMs=\(t0 + 10_000)&toMs=\(t0 + 20_000)&limit=3")
        #expect(window.compactMap { $0["timeMs"]?.intValue } == (10..<20).reversed().map { t0 + Int64($0) * 1000 })
        #expect(try ConsoleDataTests.walk(b, "stream=ma.other").count == 1)
        // The rollups count the records stored once, not the repeated ones.
        let top = try b.get("/v1/admin/analytics/shop/top-events?fromMs=\(t0)&toMs=\(t0 + 30_000)")
        #expect(top["items"]?.arrayValue?.compactMap { $0["count"]?.intValue } == [10, 10, 10])
        let first = try #require(all.last)
        #expect(first["properties"] == ["n": 1])

        #expect(try b.request("GET", "/v1/admin/events?event=buy").status == 400)
        #expect(try b.request("GET", "/v1/admin/events?appKey=shop&cursor=nonsense").status == 400)
        #expect(try b.request("GET", "/v1/admin/events?appKey=shop&limit=501").status == 400)
        #expect(try b.request("GET", "/v1/admin/events", headers: [("Authorization", "")]).status == 401)
    }

    @Test(arguments: StoreKind.allCases) func theLiveTailReceivesAnIngestedEvent(_ kind: StoreKind) throws {
        let b = try BackendProcess(store: kind)
        let tail = try SSEReader(port: b.port, "/v1/admin/events/tail?appKey=shop&event=buy")
        #expect(tail.status == 200)
        #expect(tail.headers["content-type"] == "text/event-stream")
        try ConsoleDataTests.post(
            b, app: "shop", key: "k1",
            [
                ConsoleDataTests.event("a", "open", euid: "e", time: 1), ConsoleDataTests.event("b", "buy", euid: "e", time: 2),
            ])
        try ConsoleDataTests.post(b, app: "other", key: "k2", [ConsoleDataTests.event("c", "buy", euid: "e", time: 3)])
        let frame = try tail.next(timeout: 10)
        #expect(frame["event"] == "buy")
        #expect(frame["appKey"] == "shop")
        #expect(frame["timeMs"] == 2)
        // Only the matching event: the next frame is a later matching one.
        try ConsoleDataTests.post(b, app: "shop", key: "k3", [ConsoleDataTests.event("d", "buy", euid: "e", time: 4)])
        #expect(try tail.next(timeout: 10)["timeMs"] == 4)
    }

    @Test func aLiveTailThatDoesNotReadIsDisconnected() throws {
        let b = try BackendProcess()
        func clients() throws -> String? {
            try b.request("GET", "/metrics", headers: [("Authorization", "Bearer " + TestCredentials.operatorToken)]).text.split(
                separator: "\n"
            ).first { $0.hasPrefix("pylon_backend_sse_clients ") }.map(
                String.init)
        }
        // A small receive window, and nothing read after the head: the backend's buffer fills.
        let slow = try RawHTTPClient(port: b.port, receiveBuffer: 4096)
        try slow.send(RawHTTPClient.message("GET", "/v1/admin/events/tail"))
        try waitUntil(timeout: 10) { try clients() == "pylon_backend_sse_clients 1" }
        let big = String(repeating: "x", count: 50_000)
        // 20 MB of events: more than the kernel's buffers and the backend's 1 MiB per client.
        for k in 0..<40 {
            try ConsoleDataTests.post(
                b, app: "shop", key: "big\(k)",
                (0..<10).map { ConsoleDataTests.event("b\(k)-\($0)", "big", euid: "e", time: 1, props: ["pad": .string(big)]) })
            if try clients() == "pylon_backend_sse_clients 0" { break }
        }
        try waitUntil(timeout: 10) { try clients() == "pylon_backend_sse_clients 0" }
        withExtendedLifetime(slow) {}
    }

    @Test func liveTailsAreBounded() throws {
        let b = try BackendProcess(["--max-sse-clients", "1"])
        let first = try SSEReader(port: b.port, "/v1/admin/events/tail")
        #expect(first.status == 200)
        let second = try b.request("GET", "/v1/admin/events/tail")
        #expect(second.status == 503)
    }

    /// A device registered with the fleet key and push-registered: its device id, device token
    /// and push token.
    static func device(_ b: BackendProcess, _ install: String) throws -> (id: String, token: String, push: String) {
        let d = try b.post("/v1/devices/register", ["installId": .string(install)])
        let token = try #require(d["token"]?.stringValue)
        let id = try #require(d["deviceId"]?.stringValue)
        let r = try b.request("POST", "/v1/push/register", headers: [("Authorization", "Bearer " + token)], body: Array("{}".utf8))
        let push = try #require(try r.json()["token"]?.stringValue)
        return (id, token, push)
    }

    /// A batch posted with a device's own token (so its install is recorded with the events).
    static func post(_ b: BackendProcess, stream: String, key: String, token: String, _ records: [JSON]) throws {
        let body: JSON = ["batch": .string(key), "stream": .string(stream), "records": .array(records)]
        let r = try b.request(
            "POST", "/v1/batches/\(stream)", headers: [("Idempotency-Key", key), ("Authorization", "Bearer " + token)],
            body: Array(body.serialized.utf8))
        guard r.status == 200 else { throw TestFailure(description: "batch \(key): \(r.status) \(r.text)") }
    }

    @Test(arguments: StoreKind.allCases) func anErasedUserIsFoundByNoAPI(_ kind: StoreKind) throws {
        let b = try BackendProcess(store: kind)
        // The device starts the AppKey with its own token (so its events on ma.shop are taken).
        let dev = try ConsoleDataTests.device(b, "install-9")
        let start = try b.request(
            "POST", "/v1/ma/shop/start", headers: [("Authorization", "Bearer " + dev.token)],
            body: Array(JSON.object(["deviceId": "d1", "identity": ["user_id": "u-9"]]).serialized.utf8))
        let gone = try #require(try start.json()["euid"]?.stringValue)
        #expect(try b.identify("d1", gone, ["email": "nine@example.com"], app: "shop")["euid"] == .string(gone))
        let kept = try #require(try b.ma("start", ["deviceId": "d2", "identity": ["user_id": "u-10"]], app: "shop")["euid"]?.stringValue)
        let bind = try b.request(
            "POST", "/v1/push/bind", headers: [("Authorization", "Bearer " + dev.token)],
            body: Array(JSON.object(["token": .string(dev.push), "userId": "u-9"]).serialized.utf8))
        #expect(try bind.json()["code"] == 0)
        try ConsoleDataTests.post(
            b, stream: "ma.shop", key: "k1", token: dev.token,
            (0..<5).map { ConsoleDataTests.event("g\($0)", "view", euid: gone, time: 1000 + Int64($0)) }
                + (0..<3).map { ConsoleDataTests.event("k\($0)", "view", euid: kept, time: 2000 + Int64($0)) })
        try ConsoleDataTests.post(
            b, stream: "pylon.consent", key: "c1", token: dev.token,
            [["id": "c1", "ts": 3000, "data": ["switch": "ma:shop", "granted": false, "euid": .string(gone)]]])
        #expect(try ConsoleDataTests.walk(b, "appKey=shop&user=u-9").count == 5)
        #expect(try ConsoleDataTests.walk(b, "appKey=shop&user=u-9").first?["installId"] == "install-9")
        #expect(try b.get("/v1/admin/users?q=u-9")["items"]?.arrayValue?.first?["optedOut"] == true)
        #expect(try b.get("/v1/admin/optouts?appKey=shop")["items"]?.arrayValue?.count == 1)
        #expect(try b.request("GET", "/v1/admin/users/shop/\(gone)").status == 200)

        let r = try b.request("POST", "/v1/admin/erasures", body: Array(#"{"appKey":"shop","userId":"u-9"}"#.utf8))
        #expect(r.status == 200)
        let erasure = try r.json()
        #expect(erasure["status"] == "done")
        #expect(erasure["deleted"]?["events"] == 6)  // five events and its consent report
        #expect(erasure["deleted"]?["bindings"] == 1)
        #expect(erasure["deleted"]?["profile"] == 1)
        let id = try #require(erasure["id"]?.stringValue)

        // Nothing of the user by any read: events, users, user detail, MA inspection, records,
        // push bindings, opt-outs; the other user is untouched.
        #expect(try ConsoleDataTests.walk(b, "appKey=shop&euid=\(gone)").isEmpty)
        #expect(try ConsoleDataTests.walk(b, "appKey=shop&user=u-9").isEmpty)
        #expect(try ConsoleDataTests.walk(b, "appKey=shop").compactMap { $0["euid"]?.stringValue } == Array(repeating: kept, count: 3))
        for q in ["u-9", "nine@example.com", gone] {
            #expect(try b.get("/v1/admin/users?q=\(q)")["items"]?.arrayValue?.isEmpty == true, "users?q=\(q)")
        }
        #expect(try b.get("/v1/admin/users?appKey=shop")["items"]?.arrayValue?.compactMap { $0["euid"]?.stringValue } == [kept])
        #expect(try b.request("GET", "/v1/admin/users/shop/\(gone)").status == 404)
        #expect(try b.request("GET", "/v1/inspect/ma/shop/users/\(gone)").status == 404)
        let records = try b.get("/v1/inspect/streams/ma.shop/records")["records"]?.arrayValue ?? []
        #expect(records.count == 3)
        #expect(!records.contains { $0.serialized.contains(gone) })
        #expect(!(try b.get("/v1/inspect/push/bindings").serialized.contains("u-9")))
        #expect(try b.get("/v1/admin/optouts")["items"]?.arrayValue?.isEmpty == true)
        let devicePage = try b.get("/v1/admin/devices/install-9").serialized
        #expect(!devicePage.contains(gone) && !devicePage.contains("u-9"))
        #expect(try b.get("/v1/admin/devices?q=u-9")["items"]?.arrayValue?.isEmpty == true)
        #expect(try b.get("/v1/admin/analytics/shop/uniques?fromMs=0&toMs=86400000")["items"] == [["day": "1970-01-01", "users": 1]])
        // The request is kept, without the user.
        let kept1 = try b.get("/v1/admin/erasures/\(id)")
        #expect(kept1["status"] == "done" && kept1["finishedMs"]?.intValue != nil)
        #expect(!kept1.serialized.contains(gone) && !kept1.serialized.contains("u-9"))
        #expect(try b.get("/v1/admin/erasures")["items"]?.arrayValue?.count == 1)
        #expect(try b.request("POST", "/v1/admin/erasures", body: Array(#"{"appKey":"shop"}"#.utf8)).status == 400)
    }

    @Test func eraseUserFromTheCommandLine() throws {
        let dir = NSTemporaryDirectory() + "pylon-erase-cli-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let db = ["--db", dir + "/backend.db"]
        let b = try BackendProcess(dir: dir, database: db)
        try ConsoleDataTests.post(b, app: "shop", key: "k1", [ConsoleDataTests.event("a", "view", euid: "e-cli", time: 5)])
        #expect(b.stop() == 0)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylon-backend")
        p.arguments = db + ["--erase-user", "shop:e-cli"]
        let out = Pipe()
        p.standardOutput = out
        try p.run()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        #expect(p.terminationStatus == 0)
        let answer = try JSON.parse(text.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(answer["status"] == "done" && answer["deleted"]?["events"] == 1)
        let again = try BackendProcess(dir: dir, database: db)
        #expect(try ConsoleDataTests.walk(again, "appKey=shop").isEmpty)
        #expect(try again.get("/v1/admin/erasures")["items"]?.arrayValue?.first?["actor"] == "cli")
    }

    @Test func aScheduledSendFiresAfterARestartAndACancelledOneNever() throws {
        let broker = try AnonymousBroker()
        let dir = NSTemporaryDirectory() + "pylon-schedule-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let args = ["--mqtt", "127.0.0.1:\(broker.port)"]
        let db = ["--db", dir + "/backend.db"]
        var b = try BackendProcess(args, dir: dir, database: db)
        let dev = try ConsoleDataTests.device(b, "i1")
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        func schedule(_ at: Int64) throws -> String {
            let body: JSON = ["appId": "a1", "targetType": "device", "target": .string(dev.push), "title": "later", "atMs": .int(at)]
            let r = try b.request("POST", "/v1/admin/push/schedule", body: Array(body.serialized.utf8))
            guard r.status == 200, let id = try r.json()["id"]?.stringValue else { throw TestFailure(description: "\(r.status) \(r.text)") }
            return id
        }
        let due = try schedule(now + 3000)
        let cancelled = try schedule(now + 4000)
        #expect(try b.request("DELETE", "/v1/admin/push/scheduled/\(cancelled)").status == 200)
        #expect(try b.request("DELETE", "/v1/admin/push/scheduled/\(cancelled)").status == 409)
        #expect(try b.request("POST", "/v1/admin/push/schedule", body: Array(#"{"appId":"a1","atMs":1}"#.utf8)).status == 400)
        // Kept across a restart.
        #expect(b.stop() == 0)
        b = try BackendProcess(args, dir: dir, database: db)
        func row(_ id: String) throws -> JSON? {
            try b.get("/v1/admin/push/scheduled")["items"]?.arrayValue?.first { $0["id"] == .string(id) }
        }
        try waitUntil(timeout: 20) { try row(due)?["status"] == "sent" }
        let msgId = try #require(try row(due)?["msgId"]?.stringValue)
        #expect(try row(cancelled)?["status"] == "cancelled")
        let messages = try b.get("/v1/admin/push/messages")["items"]?.arrayValue ?? []
        #expect(messages.count == 1)
        #expect(messages.first?["id"] == .string(msgId))
        #expect(messages.first?["actor"]?.stringValue?.contains("scheduled") == true)
    }

    @Test(arguments: StoreKind.allCases) func theFunnelCountsSentDeliveredOpenedAndSaysWhyNot(_ kind: StoreKind) throws {
        let broker = try AnonymousBroker()
        let b = try BackendProcess(["--mqtt", "127.0.0.1:\(broker.port)"], store: kind)
        let one = try ConsoleDataTests.device(b, "i1")
        let two = try ConsoleDataTests.device(b, "i2")
        let three = try ConsoleDataTests.device(b, "i3")
        for d in [one, two, three] {
            let r = try b.request(
                "POST", "/v1/push/bind", headers: [("Authorization", "Bearer " + d.token)],
                body: Array(JSON.object(["token": .string(d.push), "userId": "fan"]).serialized.utf8))
            #expect(try r.json()["code"] == 0)
        }
        let send: JSON = ["appId": "a1", "targetType": "user", "target": "fan", "title": "hello", "content": "world"]
        var sent = JSON.null
        try waitUntil(timeout: 10) {
            let r = try b.request("POST", "/v1/admin/push/send", body: Array(send.serialized.utf8))
            if r.status == 200 { sent = try r.json() }
            return r.status == 200
        }
        let msgId = try #require(sent["msgId"]?.stringValue)
        #expect(sent["devices"] == 3)
        // Device one acknowledges (over MQTT, as the push plugin does) and reports an open;
        // device two acknowledges; device three reported its push switch denied.
        try MQTTPublish.once(port: broker.port, topic: "pylon/push/ack/\(one.id)", payload: #"{"ids":["\#(msgId)"]}"#)
        try MQTTPublish.once(port: broker.port, topic: "pylon/push/ack/\(two.id)", payload: #"{"ids":["\#(msgId)"]}"#)
        try ConsoleDataTests.post(
            b, stream: "push.opens", key: "o1", token: one.token,
            [["id": .string(msgId), "ts": 1, "data": ["msgId": .string(msgId), "token": .string(one.push), "openedAt": 7]]])
        try ConsoleDataTests.post(
            b, stream: "pylon.consent", key: "c3", token: three.token,
            [["id": "c3", "ts": 1, "data": ["switch": "push", "granted": false]]])
        var message = JSON.null
        try waitUntil(timeout: 10) {
            message = try b.get("/v1/admin/push/messages")["items"]?.arrayValue?.first ?? .null
            return message["counts"]?["delivered"] == 2
        }
        #expect(message["counts"] == ["sent": 3, "delivered": 2, "opened": 1])
        #expect(message["title"] == "hello" && message["body"] == "world")
        #expect(message["target"] == ["type": "user", "value": "fan"])
        let detail = try b.get("/v1/admin/push/messages/\(msgId)")
        let states = Dictionary(
            uniqueKeysWithValues: (detail["devices"]?.arrayValue ?? []).compactMap { d in
                d["installId"]?.stringValue.map { ($0, d["state"]?.stringValue ?? "") }
            })
        #expect(states == ["i1": "opened", "i2": "delivered", "i3": "refused_consent"])
        #expect(try b.get("/v1/admin/push/why?messageId=\(msgId)&installId=i3")["state"] == "refused_consent")
        #expect(try b.get("/v1/admin/push/why?messageId=\(msgId)&installId=nobody")["state"] == "unbound")
        #expect(try b.request("GET", "/v1/admin/push/why?messageId=nope&installId=i1").status == 404)
    }

    @Test(arguments: StoreKind.allCases) func analyticsAreComputedByTheDatabase(_ kind: StoreKind) throws {
        let b = try BackendProcess(store: kind)
        let day: Int64 = 86_400_000
        let t0 = 20_000 * day  // a midnight
        var records: [JSON] = []
        // Day 0: u1 views then buys, u2 and u3 view; u2 buys a day later, u3 nine days later.
        records.append(ConsoleDataTests.event("1", "view", euid: "u1", time: t0 + 1000))
        records.append(ConsoleDataTests.event("2", "buy", euid: "u1", time: t0 + 2000))
        records.append(ConsoleDataTests.event("3", "view", euid: "u2", time: t0 + 3000))
        records.append(ConsoleDataTests.event("4", "view", euid: "u3", time: t0 + 4000))
        records.append(ConsoleDataTests.event("5", "buy", euid: "u2", time: t0 + day + 5000))
        records.append(ConsoleDataTests.event("6", "buy", euid: "u3", time: t0 + 9 * day))
        try ConsoleDataTests.post(b, app: "shop", key: "k1", records)
        let range = "fromMs=\(t0)&toMs=\(t0 + 10 * day)"
        let counts = try b.get("/v1/admin/analytics/shop/counts?\(range)&bucket=day")
        #expect(
            counts["items"] == [
                ["tMs": .int(t0), "events": 4], ["tMs": .int(t0 + day), "events": 1], ["tMs": .int(t0 + 9 * day), "events": 1],
            ])
        let top = try b.get("/v1/admin/analytics/shop/top-events?\(range)&limit=1")
        #expect(top["items"] == [["event": "buy", "count": 3]])
        let uniques = try b.get("/v1/admin/analytics/shop/uniques?\(range)")
        #expect(uniques["items"]?.arrayValue?.first == ["day": .string(AnalyticsDay.of(t0)), "users": 3])
        let funnel = try b.get("/v1/admin/analytics/shop/funnel?a=view&b=buy&days=2&fromMs=\(t0)&toMs=\(t0 + 7 * day)")
        #expect(funnel["a"] == 3 && funnel["ab"] == 2)
        #expect(try b.request("GET", "/v1/admin/analytics/shop/counts?fromMs=0&toMs=\(t0)&bucket=hour").status == 400)
        // A longer range is cut to its last 7 days (from t0 here), and says so.
        let cut = try b.get("/v1/admin/analytics/shop/funnel?a=view&b=buy&days=2&fromMs=\(t0 - 3 * day)&toMs=\(t0 + 7 * day)")
        #expect(cut["fromMs"] == .int(t0) && cut["a"] == 3)
        #expect(try b.request("GET", "/v1/admin/analytics/shop/nothing").status == 404)
    }

    @Test func withNATSTwoInstancesSearchTailAndEraseFromTheStream() throws {
        let nats = try NATSCluster(nodes: 1)
        let db = try StoreKind.postgres.databaseArguments()
        let a = try BackendProcess(["--nats", nats.urls], database: db)
        let b = try BackendProcess(["--nats", nats.urls], database: db)
        for x in [a, b] { try waitUntil(timeout: 60) { try x.get("/v1/inspect/stats")["nats"]?["ready"] == true } }
        let tail = try SSEReader(port: b.port, "/v1/admin/events/tail?appKey=shop")
        try ConsoleDataTests.post(
            a, app: "shop", key: "k1",
            [ConsoleDataTests.event("g1", "view", euid: "gone", time: 10), ConsoleDataTests.event("g2", "buy", euid: "gone", time: 11)])
        try ConsoleDataTests.post(a, app: "shop", key: "k2", [ConsoleDataTests.event("k1", "view", euid: "kept", time: 12)])
        // B's tail shows what A ingested (the index is shared), and so does B's search.
        #expect(try tail.next(timeout: 10)["euid"] == "gone")
        #expect(try ConsoleDataTests.walk(b, "appKey=shop").count == 3)
        #expect(try b.get("/v1/inspect/stats")["records"] == 0)  // the records table stays empty
        #expect(try StreamReader.readAll(urls: nats.urls, durable: "before").count == 2)

        let r = try a.request("POST", "/v1/admin/erasures", body: Array(#"{"appKey":"shop","euid":"gone"}"#.utf8))
        let id = try #require(try r.json()["id"]?.stringValue)
        try waitUntil(timeout: 20) { try b.get("/v1/admin/erasures/\(id)")["status"] == "done" }
        #expect(try ConsoleDataTests.walk(b, "appKey=shop").compactMap { $0["euid"]?.stringValue } == ["kept"])
        // The batch that held the user's records is gone from the stream; the other stays.
        let left = try StreamReader.readAll(urls: nats.urls, durable: "after")
        #expect(left.map(\.msgId) == ["k2"])

        // The stream's retention: set through the API, applied to the stream by JetStream.
        let put = try a.request("PUT", "/v1/admin/retention", body: Array(#"{"natsMaxAgeDays":30}"#.utf8))
        #expect(put.status == 200)
        try waitUntil(timeout: 20) { try a.get("/v1/admin/retention")["natsMaxAgeS"] == .int(30 * 86_400) }
        let config = try StreamReader.info(urls: nats.urls)["config"] as? [String: Any]
        #expect((config?["max_age"] as? Int) == 30 * 86_400 * 1_000_000_000)
        #expect(try b.get("/v1/admin/retention")["natsMaxAgeDays"] == 30)
    }

    @Test(arguments: StoreKind.allCases) func retentionExpiresOldEventsAndAnOptOutErasesWhenTheAppSaysSo(_ kind: StoreKind) throws {
        let b = try BackendProcess(store: kind)
        let now = Int64(Date().timeIntervalSince1970 * 1000)
        try ConsoleDataTests.post(
            b, app: "shop", key: "k1",
            (0..<3).map { ConsoleDataTests.event("old\($0)", "view", euid: "e1", time: now - 10 * 86_400_000 + Int64($0)) }
                + [ConsoleDataTests.event("new", "view", euid: "e1", time: now)])
        try ConsoleDataTests.post(b, app: "other", key: "k2", [ConsoleDataTests.event("o", "view", euid: "e9", time: 5)])
        let put = try b.request("PUT", "/v1/admin/retention", body: Array(#"{"apps":{"shop":{"maxAgeDays":2}}}"#.utf8))
        #expect(put.status == 200)
        #expect(try put.json()["apps"] == ["shop": ["maxAgeDays": 2]])
        #expect(try b.request("PUT", "/v1/admin/retention", body: Array(#"{"apps":{"shop":{"maxAgeDays":0}}}"#.utf8)).status == 400)
        try waitUntil(timeout: 30) { try ConsoleDataTests.walk(b, "appKey=shop").count == 1 }
        #expect(try ConsoleDataTests.walk(b, "appKey=other").count == 1)
        #expect(try b.get("/v1/inspect/streams/ma.shop/records")["records"]?.arrayValue?.count == 1)

        // eraseOnOptOut: a reported opt-out naming the user erases them.
        let set = try b.request("PUT", "/v1/admin/apps/shop/settings", body: Array(#"{"eraseOnOptOut":true}"#.utf8))
        #expect(try set.json() == ["eraseOnOptOut": true, "maxAgeDays": 2])
        try ConsoleDataTests.post(
            b, stream: "pylon.consent", key: "c1", token: TestCredentials.deviceKey,
            [["id": "c1", "ts": .int(now), "data": ["switch": "ma:shop", "granted": false, "euid": "e1"]]])
        try waitUntil(timeout: 20) { try ConsoleDataTests.walk(b, "appKey=shop").isEmpty }
        #expect(try b.get("/v1/admin/erasures")["items"]?.arrayValue?.first?["actor"] == "opt-out")

        // The uploader's own report names no user ({switch, granted, timeMs}): the user is the
        // one of the install's latest event of that AppKey.
        let dev = try ConsoleDataTests.device(b, "install-o")
        let start = try b.request(
            "POST", "/v1/ma/shop/start", headers: [("Authorization", "Bearer " + dev.token)],
            body: Array(JSON.object(["deviceId": "do"]).serialized.utf8))
        let euid = try #require(try start.json()["euid"]?.stringValue)
        try ConsoleDataTests.post(
            b, stream: "ma.shop", key: "k3", token: dev.token, [ConsoleDataTests.event("o1", "view", euid: euid, time: now)])
        #expect(try ConsoleDataTests.walk(b, "appKey=shop").count == 1)
        try ConsoleDataTests.post(
            b, stream: "pylon.consent", key: "c2", token: dev.token,
            [["id": "c2", "ts": .int(now), "data": ["switch": "ma:shop", "granted": false, "timeMs": .int(now)]]])
        try waitUntil(timeout: 20) { try b.request("GET", "/v1/admin/users/shop/\(euid)").status == 404 }
        #expect(try ConsoleDataTests.walk(b, "appKey=shop").isEmpty)
    }
}

/// Reads a Server-Sent Events response from a raw socket.
final class SSEReader {
    let fd: Int32
    private(set) var status = 0
    private(set) var headers: [String: String] = [:]
    private var buffer: [UInt8] = []

    init(port: UInt16, _ target: String) throws {
        let c = try RawHTTPClient(port: port)
        fd = dup(c.fd)
        try c.send(RawHTTPClient.message("GET", target))
        let head = try read(until: [13, 10, 13, 10], timeout: 10)
        let lines = String(decoding: head, as: UTF8.self).components(separatedBy: "\r\n")
        status = Int(lines.first?.split(separator: " ").dropFirst().first ?? "") ?? 0
        for l in lines.dropFirst() {
            guard let colon = l.firstIndex(of: ":") else { continue }
            headers[l[..<colon].lowercased()] = l[l.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
    }

    deinit { close(fd) }

    /// The bytes up to and including `delimiter`, waiting at most `timeout` seconds.
    private func read(until delimiter: [UInt8], timeout: Double) throws -> [UInt8] {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            if buffer.count >= delimiter.count {
                for i in 0...(buffer.count - delimiter.count) where buffer[i..<(i + delimiter.count)].elementsEqual(delimiter) {
                    let out = Array(buffer[..<(i + delimiter.count)])
                    buffer.removeFirst(i + delimiter.count)
                    return out
                }
            }
            let left = Int32(max(0, deadline.timeIntervalSinceNow * 1000))
            var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard left > 0, poll(&pfd, 1, left) == 1 else { throw TestFailure(description: "nothing within \(timeout) s") }
            var b = [UInt8](repeating: 0, count: 65536)
            let n = recv(fd, &b, b.count, 0)
            guard n > 0 else { throw TestFailure(description: "the stream closed") }
            buffer.append(contentsOf: b[..<n])
        }
    }

    /// The data of the next `event: record` frame (comments and other frames skipped).
    func next(timeout: Double) throws -> JSON {
        let deadline = Date().addingTimeInterval(timeout)
        while true {
            let frame = String(decoding: try read(until: [10, 10], timeout: max(0.01, deadline.timeIntervalSinceNow)), as: UTF8.self)
            let lines = frame.split(separator: "\n")
            guard lines.contains("event: record"), let data = lines.first(where: { $0.hasPrefix("data: ") }) else { continue }
            return try JSON.parse(String(data.dropFirst(6)))
        }
    }
}

/// `YYYY-MM-DD` of a time in ms (UTC), as the API writes days.
enum AnalyticsDay {
    static func of(_ ms: Int64) -> String {
        let f = DateFormatter()
        f.timeZone = TimeZone(identifier: "UTC")
        f.dateFormat = "yyyy-MM-dd"
        return f.string(from: Date(timeIntervalSince1970: Double(ms) / 1000))
    }
}

/// One MQTT 3.1.1 QoS 0 publish over a raw socket (CONNECT, CONNACK, PUBLISH, DISCONNECT): a
/// device's acknowledgement on the anonymous test broker.
enum MQTTPublish {
    static func once(port: UInt16, topic: String, payload: String) throws {
        let c = try RawHTTPClient(port: port)
        func utf8(_ s: String) -> [UInt8] { let b = Array(s.utf8); return [UInt8(b.count >> 8), UInt8(b.count & 0xFF)] + b }
        func packet(_ type: UInt8, _ body: [UInt8]) -> [UInt8] {
            var out = [type]
            var n = body.count
            repeat {
                var byte = UInt8(n % 128)
                n /= 128
                if n > 0 { byte |= 0x80 }
                out.append(byte)
            } while n > 0
            return out + body
        }
        let connect = utf8("MQTT") + [4, 0x02, 0, 30] + utf8("test-ack-" + String(UInt32.random(in: 0...UInt32.max)))
        try c.send(packet(0x10, connect))
        var ack = [UInt8](repeating: 0, count: 4)
        var pfd = pollfd(fd: c.fd, events: Int16(POLLIN), revents: 0)
        guard poll(&pfd, 1, 5000) == 1, recv(c.fd, &ack, 4, 0) == 4, ack[0] == 0x20, ack[3] == 0 else {
            throw TestFailure(description: "no CONNACK from the broker")
        }
        try c.send(packet(0x30, utf8(topic) + Array(payload.utf8)))
        try c.send([0xE0, 0])
        _ = try c.isClosedByPeer(timeoutMs: 2000)
    }
}
