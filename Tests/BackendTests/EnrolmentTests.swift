import Foundation
import PylonClientKit
import PylonStore
import TestSupport
import Testing

@testable import PylonBackend

/// Enrolment that cannot take a device over (issue 34 item 4): the enrolment secret registers
/// new installs only, an existing one needs its own device token or an operator's approval;
/// every stored batch names the device that sent it; a device token writes `ma.<appKey>` only
/// for an AppKey that device declared. Two devices, A and B, on one backend.
@Suite(.serialized) struct EnrolmentTests {
    static func bearer(_ t: String) -> [(String, String)] { [("Authorization", "Bearer " + t)] }

    static func register(_ b: BackendProcess, _ install: String, _ credential: String) throws -> HTTPReply {
        try b.request(
            "POST", "/v1/devices/register", headers: bearer(credential), body: Array(#"{"installId":"\#(install)"}"#.utf8))
    }

    static func post(_ b: BackendProcess, _ path: String, _ token: String, _ body: JSON, key: String? = nil) throws -> HTTPReply {
        try b.request(
            "POST", path, headers: bearer(token) + (key.map { [("Idempotency-Key", $0)] } ?? []), body: Array(body.serialized.utf8))
    }

    @Test(arguments: StoreKind.allCases) func theEnrolmentSecretCannotTakeAnExistingInstall(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let a = try Self.register(b, "install-a", TestCredentials.deviceKey)
        #expect(a.status == 200)
        let aToken = try #require(try a.json()["token"]?.stringValue)
        let aId = try #require(try a.json()["deviceId"]?.stringValue)
        let aPush = try #require(try Self.post(b, "/v1/push/register", aToken, [:]).json()["token"]?.stringValue)

        // Device B holds the enrolment secret (every device does) and tries A's install id.
        let takeover = try Self.register(b, "install-a", TestCredentials.deviceKey)
        #expect(takeover.status == 409)
        #expect(try takeover.json()["code"] == "already_registered")
        #expect(try takeover.json()["token"] == nil, "no credential handed out")
        #expect(try takeover.json()["error"]?.stringValue?.contains("/v1/admin/devices/install-a/reenrol") == true)

        // A keeps its credential (its broker password too) and its push identity.
        let again = try Self.post(b, "/v1/push/register", aToken, [:])
        #expect(again.status == 200)
        #expect(try again.json()["token"]?.stringValue == aPush)

        // A renews with its own token; the old token then stops working.
        let renewed = try Self.register(b, "install-a", aToken)
        #expect(renewed.status == 200)
        #expect(try renewed.json()["deviceId"]?.stringValue == aId)
        let aToken2 = try #require(try renewed.json()["token"]?.stringValue)
        #expect(try Self.post(b, "/v1/push/register", aToken, [:]).status == 401)

        // An operator approves one re-enrolment (a device that lost its token): the secret
        // works once, for the same device id, then is refused again.
        #expect(try b.request("POST", "/v1/admin/devices/never-seen/reenrol", body: Array("{}".utf8)).status == 404)
        let approval = try b.request("POST", "/v1/admin/devices/install-a/reenrol", body: Array("{}".utf8))
        #expect(approval.status == 200)
        #expect(try b.request("POST", "/v1/admin/devices/install-a/reenrol", headers: Self.bearer(aToken2)).status == 403)
        let approved = try Self.register(b, "install-a", TestCredentials.deviceKey)
        #expect(approved.status == 200)
        #expect(try approved.json()["deviceId"]?.stringValue == aId)
        #expect(try Self.post(b, "/v1/push/register", aToken2, [:]).status == 401)
        #expect(try Self.register(b, "install-a", TestCredentials.deviceKey).status == 409, "an approval is used once")
        let audit = try b.get("/v1/admin/audit?action=device.reenrol.approve")
        #expect(audit["items"]?.arrayValue?.first?["target"] == "install-a")
    }

    @Test(arguments: StoreKind.allCases) func recordsNameTheirDeviceAndAppStreamsNeedTheAppOnTheDevice(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let a = try Self.register(b, "dev-a", TestCredentials.deviceKey).json()
        let bb = try Self.register(b, "dev-b", TestCredentials.deviceKey).json()
        let (aId, aToken) = (try #require(a["deviceId"]?.stringValue), try #require(a["token"]?.stringValue))
        let bToken = try #require(bb["token"]?.stringValue)

        // App "appb" is registered on B only (its MA plugin's start, with B's token).
        #expect(try Self.post(b, "/v1/ma/appb/start", bToken, ["deviceId": "b"]).json()["code"] == 0)
        #expect(try Self.post(b, "/v1/ma/appa/start", aToken, ["deviceId": "a"]).json()["code"] == 0)

        // A's token cannot write into B's app stream...
        let refused = try Self.post(
            b, "/v1/batches/ma.appb", aToken, batchBody(key: "x1", stream: "ma.appb", ids: ["e1"]), key: "x1")
        #expect(refused.status == 403)
        #expect(try refused.json()["code"] == "app_not_registered")
        #expect(try b.get("/v1/inspect/streams/ma.appb")["records"] == 0)
        // ...B's can, and A writes its own app's stream and a stream of no app.
        #expect(
            try Self.post(b, "/v1/batches/ma.appb", bToken, batchBody(key: "x2", stream: "ma.appb", ids: ["e2"]), key: "x2").status
                == 200)
        #expect(
            try Self.post(b, "/v1/batches/ma.appa", aToken, batchBody(key: "x3", stream: "ma.appa", ids: ["e3"]), key: "x3").status
                == 200)
        #expect(try Self.post(b, "/v1/batches/logs", aToken, batchBody(key: "x4", stream: "logs", ids: ["l1"]), key: "x4").status == 200)

        // Each stored record carries the device that sent it; the enrolment secret names none.
        #expect(try b.postBatch("logs", key: "x5", batchBody(key: "x5", stream: "logs", ids: ["l2"])).status == 200)
        let records = try b.get("/v1/inspect/streams/logs/records")["records"]?.arrayValue ?? []
        #expect(records.map { $0["id"] } == ["l1", "l2"])
        #expect(records.map { $0["deviceId"] } == [.string(aId), .null])
        let appa = try b.get("/v1/inspect/streams/ma.appa/records")["records"]?.arrayValue ?? []
        #expect(appa.first?["deviceId"] == .string(aId))
    }

    /// Two backends on one PostgreSQL database register the same new install at the same
    /// instant, ten times. A request that found the install absent and lost the race for its
    /// unique id answers the winner's registration (it was a 500 from the 23505); one that found
    /// it registered already is 409 like any enrolment of an existing install. Never a 500, and
    /// every 200 of a pair carries the same device and token.
    @Test func twoInstancesRegisteringOneNewInstallAnswerTheWinner() throws {
        let one = try BackendProcess(store: .postgres)
        let two = try BackendProcess(database: one.database)
        var bothOK = 0
        for i in 0..<10 {
            let replies = try race([one.port, two.port]) { _ in ("POST", "/v1/devices/register", ["installId": .string("race-\(i)")]) }
            let statuses = replies.map(\.status)
            #expect(statuses.allSatisfy { $0 == 200 || $0 == 409 } && statuses.contains(200), "pair \(i): \(replies.map(\.text))")
            let ok = replies.filter { $0.status == 200 }
            let tokens = Set(ok.compactMap { try? $0.json()["token"]?.stringValue })
            #expect(tokens.count == 1, "pair \(i): one registration answered")
            if ok.count == 2 { bothOK += 1 }
            if let t = tokens.first { #expect(try Self.post(one, "/v1/push/register", t, [:]).status == 200) }
        }
        let concurrent = [one, two].map { $0.logText.components(separatedBy: "answering the winner's registration").count - 1 }.reduce(0, +)
        #expect(concurrent == bothOK, "each pair answered 200 twice went through the race path")
        print("registration race: \(bothOK) of 10 pairs raced on the insert (both answered the winner), the rest 200 + 409")
    }

    /// A format-1 file (batches without `device_id`) gains the column at open: its batches name
    /// no device, new ones do.
    @Test func aFormat1DatabaseGainsTheBatchDevice() throws {
        let dir = NSTemporaryDirectory() + "pylon-enrol-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/backend.sqlite"
        do {
            let db = try Database(path: path)
            let v1 = Store.schema.replacingOccurrences(of: #",\s*device_id TEXT"#, with: "", options: .regularExpression)
            #expect(!v1.contains("device_id"))
            try db.exec(v1)
            try db.exec(
                """
                INSERT INTO streams (id, name) VALUES (1, 's');
                INSERT INTO batches (id, key, stream, received_at, record_count, accepted) VALUES (1, 'k0', 1, 1, 1, 1);
                INSERT INTO records (stream, id, ts, data, batch) VALUES (1, 'r0', 1, '{}', 1);
                PRAGMA user_version = 1;
                """)
            db.close()
        }
        func batch(_ key: String, _ id: String) throws -> Batch {
            try Batch.parse(Array(#"{"records":[{"id":"\#(id)","ts":1,"data":{}}]}"#.utf8), key: key, stream: "s")
        }
        let store = try Store(path: path)
        defer { store.close() }
        #expect(try store.storedFormat() == Store.format)
        _ = try store.ingest(try batch("k1", "r1"), receivedAt: 2, deviceId: "00112233aabbccdd")
        #expect(try store.records(stream: "s", after: 0, limit: 10).map(\.deviceId) == [nil, "00112233aabbccdd"])
    }

    /// The broker token's MAC is RFC 2104 HMAC-SHA256 (RFC 4231 test case 2), and the token
    /// binds kid, expiry, username and client id.
    @Test func brokerTokensAreHMACSHA256OverUserAndClientId() throws {
        let mac = MQTTAuth.hmacSHA256(key: Array("Jefe".utf8), Array("what do ya want for nothing?".utf8))
        #expect(
            mac.map { String($0, radix: 16).leftPad(2) }.joined()
                == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
        let auth = MQTTAuth(kid: "k1", key: [UInt8](repeating: 0xAB, count: 32))
        let t = auth.token(username: "d1", clientId: "pylon-push-i1", nowS: 1000, validS: 60)
        let expected = MQTTAuth.hmacSHA256(key: auth.key, Array("pm1.k1.1060\nd1\npylon-push-i1".utf8))
        #expect(t == "pm1.k1.1060." + expected.map { String($0, radix: 16).leftPad(2) }.joined())
        #expect(t != auth.token(username: "d1", clientId: "pylon-push-i2", nowS: 1000, validS: 60))
    }

    /// `--mqtt-auth-key-file` needs a broker and is one broker-auth mode of three.
    @Test func theBrokerKeyFileNeedsABrokerAndExcludesTheOtherModes() throws {
        #expect(throws: Options.UsageError.self) { _ = try Options.parse(["--mqtt-auth-key-file", "/k"]) }
        #expect(throws: Options.UsageError.self) {
            _ = try Options.parse(["--mqtt", "127.0.0.1:1883", "--mqtt-username", "u", "--mqtt-dynsec", "--mqtt-auth-key-file", "/k"])
        }
        let o = try Options.parse(["--mqtt", "127.0.0.1:1883", "--mqtt-auth-key-file", "/k"])
        #expect(o.mqttAuthKeyFile == "/k")
        #expect(MQTTAuth.hexBytes("0aFf") == [0x0A, 0xFF] && MQTTAuth.hexBytes("0g") == nil && MQTTAuth.hexBytes("abc") == nil)
    }
}
