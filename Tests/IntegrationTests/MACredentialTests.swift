import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// MA against a backend that refuses the device credential (401): the start is retried, as while
/// the backend is unreachable, and completes once the credential file holds one the backend
/// knows (read again for every attempt) — what a device pointed at the push plugin's
/// `device.token` sees while that plugin registers again (docs/PUSH.md).
@Suite(.serialized) struct MACredentialTests {
    @Test func aStartRefusedWith401IsRetriedWithTheCredentialReadAgain() throws {
        let b = try TestBackend()
        let key = b.dir + "/ma-credential"
        try "not-the-device-key-0123456789\n".write(toFile: key, atomically: true, encoding: .utf8)
        chmod(key, 0o600)
        let h = try TestHost(plugins: TestHost.maPlugins(b, ma: ["credentialFile": .string(key), "pendingAfterMs": 300]))
        let c = try h.client()
        do {
            _ = try c.call("ma.start", ["appKey": "cred1"], timeoutMs: 10_000)
            Issue.record("a start refused with 401 must not succeed")
        } catch let e as RPCError {
            #expect(e.code == RPCError.Code.pending.rawValue, "answered pending, kept: \(e)")
        }
        #expect(try c.call("ma.euid", ["appKey": "cred1"])["euid"] == .null)
        try (TestBackend.deviceKey + "\n").write(toFile: key + ".new", atomically: true, encoding: .utf8)
        chmod(key + ".new", 0o600)
        rename(key + ".new", key)
        var euid: JSON = .null
        try waitUntil(timeout: 20) {
            euid = try c.call("ma.euid", ["appKey": "cred1"])["euid"] ?? .null
            return euid != .null
        }
        #expect(euid.stringValue?.isEmpty == false)
    }
}
