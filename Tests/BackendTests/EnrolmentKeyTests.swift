import Foundation
import PylonClientKit
import PylonStore
import TestSupport
import Testing

@testable import PylonBackend

/// Enrolment keys for batches of devices (issue 34 item 4: the enrolment credential "can be per
/// batch of devices, revocable, expiring"): an operator makes a key, the devices of one batch
/// register with it up to its `maxDevices`, and revoking it stops it at once without touching
/// the fleet-wide secret or another batch's key.
@Suite(.serialized) struct EnrolmentKeyTests {
    static func bearer(_ t: String) -> [(String, String)] { [("Authorization", "Bearer " + t)] }

    static func makeKey(_ b: BackendProcess, _ body: JSON) throws -> HTTPReply {
        try b.request("POST", "/v1/admin/enrolment-keys", body: Array(body.serialized.utf8))
    }

    @Test(arguments: StoreKind.allCases) func aBatchKeyRegistersItsDevicesAndIsRevoked(_ store: StoreKind) throws {
        let b = try BackendProcess(store: store)
        let made = try Self.makeKey(b, ["name": "batch 1", "maxDevices": 2])
        #expect(made.status == 201, "\(made.text)")
        let key = try #require(try made.json()["key"]?.stringValue)
        let id = try #require(try made.json()["id"]?.stringValue)
        #expect(key.hasPrefix("pe1." + id + "."))

        for install in ["k-a", "k-b"] {
            let r = try EnrolmentTests.register(b, install, key)
            #expect(r.status == 200, "\(install): \(r.text)")
        }
        let third = try EnrolmentTests.register(b, "k-c", key)
        #expect(third.status == 403, "the key registered its two devices: \(third.text)")
        // The key still presents its devices' data, like the fleet-wide secret.
        let batch = batchBody(key: "kb1", stream: "s", ids: ["r1"])
        #expect(try EnrolmentTests.post(b, "/v1/batches/s", key, batch, key: "kb1").status == 200)
        // Push calls need the device's own token.
        #expect(try EnrolmentTests.post(b, "/v1/push/register", key, [:]).status == 403)

        let listed = try b.get("/v1/admin/enrolment-keys")["keys"]?.arrayValue ?? []
        let row = try #require(listed.first { $0["id"] == .string(id) })
        #expect(row["devices"] == 2 && row["usable"] == false && row["name"] == "batch 1")
        #expect(row["key"] == nil && row["secretHash"] == nil, "the secret is answered once, when the key is made")

        // A second batch's key; revoking it refuses it at once, the first key and the secret stay.
        let other = try Self.makeKey(b, ["name": "batch 2", "expiresInSeconds": 3600])
        let otherKey = try #require(try other.json()["key"]?.stringValue)
        let otherId = try #require(try other.json()["id"]?.stringValue)
        #expect(try EnrolmentTests.register(b, "k-d", otherKey).status == 200)
        #expect(try b.request("DELETE", "/v1/admin/enrolment-keys/" + otherId).status == 200)
        #expect(try EnrolmentTests.register(b, "k-e", otherKey).status == 401)
        #expect(try EnrolmentTests.post(b, "/v1/batches/s", otherKey, batch, key: "kb2").status == 401)
        #expect(try EnrolmentTests.post(b, "/v1/batches/s", key, batchBody(key: "kb3", stream: "s", ids: ["r3"]), key: "kb3").status == 200)
        #expect(try EnrolmentTests.register(b, "k-f", TestCredentials.deviceKey).status == 200)

        // A wrong secret, a malformed key, an unknown id.
        var forged = Array(key)
        forged[forged.count - 1] = forged.last == "0" ? "1" : "0"
        #expect(try EnrolmentTests.register(b, "k-g", String(forged)).status == 401)
        #expect(try EnrolmentTests.register(b, "k-g", "pe1.zz.zz").status == 401)
        #expect(try EnrolmentTests.register(b, "k-g", "pe1.0123456789abcdef." + String(repeating: "a", count: 64)).status == 401)
    }

    @Test func onlyOperatorsMakeKeysAndBadRequestsAreRefused() throws {
        let b = try BackendProcess()
        let asDevice = try b.request(
            "POST", "/v1/admin/enrolment-keys", headers: Self.bearer(TestCredentials.deviceKey), body: Array(#"{"name":"x"}"#.utf8))
        #expect(asDevice.status == 403)
        for bad: JSON in [
            [:], ["name": ""], ["name": .string(String(repeating: "n", count: 65))], ["name": "a\u{1}b"],
            ["name": "x", "expiresInSeconds": 10], ["name": "x", "maxDevices": 0], ["name": "x", "maxDevices": "3"],
        ] {
            let r = try Self.makeKey(b, bad)
            #expect(r.status == 400, "\(bad.serialized): \(r.text)")
        }
        #expect(try b.request("DELETE", "/v1/admin/enrolment-keys/0123456789abcdef").status == 404)
        #expect(try b.request("DELETE", "/v1/admin/enrolment-keys/nothex").status == 400)
    }

    /// Expiry and the device limit, on the store with the time given (no clock in the test).
    @Test func anExpiredOrFullKeyRegistersNothing() throws {
        let store = try Store(path: ":memory:")
        defer { store.close() }
        let k = Store.EnrolmentKeyRow(
            id: "0123456789abcdef", name: "b", secretHash: "h", createdBy: "admin", createdAt: 0, expiresAt: 1000, maxDevices: 1,
            devices: 0, revokedAt: nil)
        try store.createEnrolmentKey(k)
        #expect(try store.useEnrolmentKey(k.id, deviceId: "d-late", now: 1000) == false, "expired at 1000")
        #expect(try store.useEnrolmentKey(k.id, deviceId: "d1", now: 999) == true)
        #expect(try store.useEnrolmentKey(k.id, deviceId: "d2", now: 999) == false, "its one device registered")
        #expect(try store.enrolmentKeyOf(deviceId: "d1") == k.id)
        #expect(try store.enrolmentKey(k.id)?.refusal(now: 999) != nil)
        #expect(try store.revokeEnrolmentKey(k.id, now: 5) && store.enrolmentKey(k.id)?.revokedAt == 5)
    }
}
