import Foundation
import PylonClientKit
import TestSupport
import Testing

/// Authentication of the reference backend (issue 21 item 3): operator token on the admin and
/// inspection endpoints, device credentials on the device endpoints, the fault API only with
/// `--enable-fault-injection`, device registration with the enrolment secret.
@Suite(.serialized) struct BackendAuthTests {
    static let none = [("Authorization", "")]
    static func bearer(_ t: String) -> [(String, String)] { [("Authorization", "Bearer " + t)] }

    /// Every operator endpoint, with a method it takes.
    static let operatorEndpoints: [(String, String)] = [
        ("GET", "/v1/inspect/stats"), ("GET", "/v1/inspect/streams/s"), ("GET", "/v1/inspect/streams/s/records"),
        ("POST", "/v1/admin/reset"), ("GET", "/v1/admin/ma/key1"), ("POST", "/v1/admin/ma/key1"),
        ("GET", "/v1/admin/ma/key1/metadata"), ("POST", "/v1/admin/ma/key1/metadata"),
        ("GET", "/v1/inspect/ma/key1/users?email=a@b.c"), ("GET", "/v1/inspect/ma/key1/users/u1"),
        ("POST", "/v1/admin/push/send"), ("GET", "/v1/inspect/push/bindings"), ("GET", "/v1/inspect/push/sends"),
        ("GET", "/v1/inspect/push/deliveries"), ("GET", "/v1/inspect/push/opens"),
        ("POST", "/v1/admin/gtm/containers/c1/versions"), ("GET", "/v1/inspect/gtm/containers/c1"),
        ("GET", "/v1/faults"), ("POST", "/v1/faults"), ("DELETE", "/v1/faults"),
    ]

    @Test(arguments: StoreKind.allCases) func operatorEndpointsNeedTheOperatorToken(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        for (m, path) in BackendAuthTests.operatorEndpoints {
            for headers in [
                BackendAuthTests.none, BackendAuthTests.bearer("wrong-token-0123456789"), [("Authorization", "Basic dXNlcjpwYXNz")],
            ] {
                let r = try b.request(m, path, headers: headers, body: m == "POST" ? Array("{}".utf8) : [])
                #expect(r.status == 401, "\(m) \(path) with \(headers)")
                #expect(try r.json()["code"] == "unauthorized")
                #expect(r.headers["www-authenticate"]?.hasPrefix("Bearer") == true)
            }
            // A valid credential of another kind (the device key) is known but not allowed: 403.
            let r = try b.request(
                m, path, headers: BackendAuthTests.bearer(TestCredentials.deviceKey), body: m == "POST" ? Array("{}".utf8) : [])
            #expect(r.status == 403, "\(m) \(path) with the device key")
            #expect(try r.json()["code"] == "forbidden")
        }
        // Nothing was reset, no fault set: a batch stored before is still there.
        #expect(try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["a"])).status == 200)
        let ok = try b.request("GET", "/v1/inspect/streams/s", headers: BackendAuthTests.bearer(TestCredentials.operatorToken))
        #expect(ok.status == 200)
        #expect(try ok.json()["records"] == 1)
        let refused = Int64(BackendAuthTests.operatorEndpoints.count * 4)
        #expect(try b.get("/v1/inspect/stats")["refused"] == .int(refused))
    }

    @Test func withoutAnOperatorTokenFileTheOperatorAPIIsDisabled() throws {
        let b = try BackendProcess(auth: false)
        let r = try b.request("GET", "/v1/inspect/stats", headers: BackendAuthTests.bearer(TestCredentials.operatorToken))
        #expect(r.status == 403)
        #expect(try r.json()["code"] == "forbidden")
        #expect(try b.request("POST", "/v1/admin/reset", headers: BackendAuthTests.none).status == 403)
        // And no device can register (no enrolment secret, no open enrolment).
        #expect(try b.request("POST", "/v1/devices/register", body: Array(#"{"installId":"i1"}"#.utf8)).status == 401)
    }

    @Test func theFaultAPIExistsOnlyWithItsFlag() throws {
        let dir = NSTemporaryDirectory() + "pylon-backend-test-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let b = try BackendProcess(try TestCredentials.arguments(dir, faults: false), auth: false)
        for m in ["GET", "POST", "DELETE"] {
            let r = try b.request(m, "/v1/faults", body: m == "POST" ? Array(#"{"failNext":5,"status":400}"#.utf8) : [])
            #expect(r.status == 404, "\(m) /v1/faults")
        }
        #expect(try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["a"])).status == 200)
    }

    @Test(arguments: StoreKind.allCases) func deviceEndpointsNeedADeviceCredential(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let body = batchBody(key: "k", stream: "s", ids: ["a"])
        func post(_ headers: [(String, String)]) throws -> HTTPReply {
            try b.request("POST", "/v1/batches/s", headers: headers + [("Idempotency-Key", "k")], body: Array(body.serialized.utf8))
        }
        #expect(try post(BackendAuthTests.none).status == 401)
        #expect(try post(BackendAuthTests.bearer("not-the-device-key-0123")).status == 401)
        #expect(try post(BackendAuthTests.bearer("pd1.0123456789abcdef." + String(repeating: "a", count: 64))).status == 401)
        #expect(try post(BackendAuthTests.bearer(TestCredentials.operatorToken)).status == 403, "the operator token is no device key")
        #expect(try b.get("/v1/inspect/streams/s")["records"] == 0, "nothing stored by refused requests")
        #expect(try post(BackendAuthTests.bearer(TestCredentials.deviceKey)).status == 200)
        let ma = try b.request("POST", "/v1/ma/key1/start", headers: BackendAuthTests.none, body: Array("{}".utf8))
        #expect(ma.status == 401)
        #expect(try b.request("GET", "/v1/gtm/containers/c1", headers: BackendAuthTests.none).status == 401)
        #expect(try b.request("GET", "/healthz", headers: BackendAuthTests.none).status == 200)
    }

    /// The operator sets faults that fail every upload: a refused caller cannot.
    @Test(arguments: StoreKind.allCases) func anUnauthenticatedCallerCannotTurnUploadsIntoDeadLetters(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let r = try b.request(
            "POST", "/v1/faults", headers: BackendAuthTests.none, body: Array(#"{"failNext":100,"status":400}"#.utf8))
        #expect(r.status == 401)
        #expect(try b.postBatch("s", key: "k", batchBody(key: "k", stream: "s", ids: ["a"])).status == 200)
    }

    @Test(arguments: StoreKind.allCases)
    func devicesRegisterWithTheEnrolmentSecretAndActOnlyOnTheirOwnPushIdentity(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        func register(_ install: String, _ headers: [(String, String)]) throws -> HTTPReply {
            try b.request("POST", "/v1/devices/register", headers: headers, body: Array(#"{"installId":"\#(install)"}"#.utf8))
        }
        #expect(try register("victim", BackendAuthTests.none).status == 401)
        #expect(try register("victim", BackendAuthTests.bearer("wrong-secret-0123456789")).status == 401)
        let v = try register("victim", BackendAuthTests.bearer(TestCredentials.deviceKey))
        #expect(v.status == 200)
        let victim = try #require(try v.json()["token"]?.stringValue)
        #expect(try v.json()["mqtt"]?["clientId"] == "pylon-push-victim")
        let attacker = try #require(
            try register("attacker", BackendAuthTests.bearer(TestCredentials.deviceKey)).json()["token"]?.stringValue)

        func push(_ call: String, _ token: String?, _ body: JSON) throws -> HTTPReply {
            try b.request(
                "POST", "/v1/push/\(call)", headers: token.map(BackendAuthTests.bearer) ?? BackendAuthTests.none,
                body: Array(body.serialized.utf8))
        }
        // Push calls need the device's own token: not none, not the fleet key.
        #expect(try push("register", nil, [:]).status == 401)
        #expect(try push("register", TestCredentials.deviceKey, [:]).status == 403)
        #expect(try push("register", attacker, ["installId": "victim"]).status == 403, "no registering for another install")
        let vt = try #require(try push("register", victim, [:]).json()["token"]?.stringValue)
        let at = try #require(try push("register", attacker, [:]).json()["token"]?.stringValue)
        #expect(try push("bind", victim, ["token": .string(vt), "userId": "alice"]).json()["code"] == 0)
        // The attacker cannot bind or unbind on the victim's push token...
        #expect(try push("bind", attacker, ["token": .string(vt), "userId": "mallory"]).json()["code"] == 3001)
        #expect(try push("unbind", attacker, ["token": .string(vt), "userId": "alice"]).json()["code"] == 3001)
        // ...nor take the victim's Live Activity to its own device.
        let la: JSON = ["activityId": "act1", "pushToken": "pt1", "appId": "app1"]
        var mine = la.objectValue!
        mine["token"] = .string(vt)
        #expect(try push("liveactivity", victim, .object(mine)).json()["code"] == 0)
        var theirs = la.objectValue!
        theirs["token"] = .string(at)
        #expect(try push("liveactivity", attacker, .object(theirs)).json()["code"] == 3003)
        let bindings = try b.get("/v1/inspect/push/bindings")
        #expect(bindings["bindings"] == [["token": .string(vt), "userId": "alice"]])
        #expect(bindings["activities"]?.arrayValue?.first?["token"] == .string(vt))
        // A device token renews only its own install; the old token then stops working.
        #expect(try register("victim", BackendAuthTests.bearer(attacker)).status == 403)
        let renewed = try #require(try register("victim", BackendAuthTests.bearer(victim)).json()["token"]?.stringValue)
        #expect(renewed != victim)
        #expect(try push("register", victim, [:]).status == 401)
        #expect(try push("register", renewed, [:]).status == 200)
    }

    @Test(arguments: StoreKind.allCases) func openEnrolmentRegistersNewInstallsButNeverAnExistingOne(_ store: StoreKind) throws {
        let dir = NSTemporaryDirectory() + "pylon-backend-test-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let args = Array(try TestCredentials.arguments(dir).prefix(2)) + ["--open-enrolment"]
        let b = try BackendProcess(args, auth: false, store: store)
        let r = try b.request("POST", "/v1/devices/register", headers: BackendAuthTests.none, body: Array(#"{"installId":"i1"}"#.utf8))
        #expect(r.status == 200)
        let again = try b.request("POST", "/v1/devices/register", headers: BackendAuthTests.none, body: Array(#"{"installId":"i1"}"#.utf8))
        #expect(again.status == 409)
        #expect(try again.json()["code"] == "already_registered")
    }

    @Test func secretFilesReadableByOthersAreRefusedAtStart() throws {
        let dir = NSTemporaryDirectory() + "pylon-backend-test-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let args = try TestCredentials.arguments(dir)
        chmod(dir + "/operator.token", 0o644)
        #expect(throws: (any Error).self) { _ = try BackendProcess(args, auth: false) }
        try? FileManager.default.removeItem(atPath: dir)
    }
}
