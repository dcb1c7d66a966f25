import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// Handing an uploader stream, an MA AppKey or a push appId to another uid, or releasing it
/// (`uploader.setOwner`, `ma.setOwner`, `push.setOwner`; issue 25 item 6), against real plugins
/// and hostile unprivileged uids (`setpriv`, Tests/fixtures/rpc_client.py): only the host's admin
/// flag may, the new owner may use it and the old one may not, a release lets the next writer
/// claim, the owner survives a restart, and uid 0 without the flag is no admin.
@Suite(.serialized) struct OwnershipHandOverTests {
    static let nobody: UInt32 = 65534
    static let stranger: UInt32 = 65533

    /// Sends `calls` in order from a client running as `uid`; each whole response.
    func call(as uid: UInt32, _ h: TestHost, _ calls: [(String, JSON?)]) throws -> [JSON] {
        let lines = calls.map { String(decoding: Envelope.request(id: .int(0), method: $0.0, params: .params($0.1)), as: UTF8.self) }
        let replies = try h.runAs(uid: uid, sequential: true, lines).replies
        guard replies.count == lines.count else {
            throw TestFailure(description: "client as uid \(uid) got \(replies.count) of \(lines.count) replies")
        }
        return replies
    }

    func call(as uid: UInt32, _ h: TestHost, _ method: String, _ params: JSON?) throws -> JSON {
        try call(as: uid, h, [(method, params)])[0]
    }

    func enqueue(_ id: String) -> JSON { ["stream": "demo", "records": records(id, 0..<1)] }

    @Test func anAdminHandsAStreamOverAndReleasesIt() throws {
        let b = try TestBackend()
        let h = try TestHost.open(plugins: [TestHost.uploader(b, config: ["streams": ["*": ["intervalMs": 600000]]])])
        try h.waitForPlugin("uploader")
        let root = try h.client()
        // As after README's walkthrough run as root: uid 0 wrote `demo` first.
        _ = try root.call("uploader.enqueue", enqueue("root"))
        #expect(try root.call("uploader.status")["streams"]?["demo"]?["owner"] == "uid:0")

        let before = try call(
            as: Self.nobody, h,
            [("uploader.setOwner", ["stream": "demo", "owner": "uid:65534"]), ("uploader.enqueue", enqueue("n0"))])
        #expect(before[0].errorCode == -32005, "not an admin: \(before[0].serialized)")
        #expect(before[1].errorCode == -32005, "still uid 0's: \(before[1].serialized)")

        let r = try root.call("uploader.setOwner", ["stream": "demo", "owner": "uid:65534"])
        #expect(r == ["stream": "demo", "owner": "uid:65534", "previous": "uid:0"])
        #expect(try call(as: Self.nobody, h, "uploader.enqueue", enqueue("n1"))["result"]?["accepted"] == 1, "the new owner writes")
        let s = try call(as: Self.stranger, h, "uploader.enqueue", enqueue("s1"))
        #expect(s.errorCode == -32005 && s["error"]?["data"]?["owner"] == "uid:65534", "\(s.serialized)")

        // To a third uid: the previous owner is refused from then on, and the bytes moved with it.
        _ = try root.call("uploader.setOwner", ["stream": "demo", "owner": "uid:65533"])
        let old = try call(as: Self.nobody, h, [("uploader.enqueue", enqueue("n2")), ("uploader.flush", ["stream": "demo"])])
        #expect(old[0].errorCode == -32005 && old[1].errorCode == -32005, "\(old.map(\.serialized))")
        let mine = try call(as: Self.stranger, h, [("uploader.enqueue", enqueue("s2")), ("uploader.status", nil)])
        #expect(mine[0]["result"]?["accepted"] == 1)
        #expect(mine[1]["result"]?["streams"]?["demo"]?["owner"] == "uid:65533")
        #expect(mine[1]["result"]?["owner"]?["streams"] == 1)
        let owners = try root.call("uploader.status")["owners"]
        #expect(owners?["uid:65534"]?["streams"] == 0 && owners?["uid:65534"]?["diskBytes"] == 0, "\(owners?.serialized ?? "")")
        #expect((owners?["uid:65533"]?["diskBytes"]?.intValue ?? 0) > 0)

        // Released: nobody owns it, the next writer claims it.
        #expect(try root.call("uploader.setOwner", ["stream": "demo", "owner": .null])["owner"] == .null)
        #expect(try call(as: Self.nobody, h, "uploader.enqueue", enqueue("n3"))["result"]?["accepted"] == 1)
        let st = try root.call("uploader.status")
        #expect(st["streams"]?["demo"]?["owner"] == "uid:65534")
        #expect(st["ownerChanges"] == 3)
        #expect(h.logText.contains("stream owner set") && h.logText.contains("stream owner released"))

        // Owners fixed by a namespace cannot be handed over; bad params are refused.
        #expect(try root.request("uploader.setOwner", ["stream": "ma.app", "owner": "uid:1"]).errorCode == -32602)
        let bad = try root.request("uploader.setOwner", ["stream": "demo", "owner": "1000"])
        #expect(bad.errorCode == -32602)

        // The owner is in the queue database: a restart keeps it.
        h.stop()
        try h.start()
        try h.waitForPlugin("uploader")
        #expect(try h.client().call("uploader.status")["streams"]?["demo"]?["owner"] == "uid:65534")
        #expect(try call(as: Self.stranger, h, "uploader.enqueue", enqueue("s3")).errorCode == -32005)
    }

    @Test func anAdminHandsAnAppKeyOverAndReleasesIt() throws {
        let b = try TestBackend()
        let h = try TestHost.open(plugins: TestHost.maPlugins(b))
        try h.waitForPlugin("ma")
        let root = try h.client()
        let started = try call(
            as: Self.nobody, h, [("ma.start", ["appKey": "kiosk"]), ("ma.setOwner", ["appKey": "kiosk", "uid": 65534])])
        #expect(code(started[0]["result"] ?? .null) == 0, "\(started[0].serialized)")
        #expect(code(started[1]["result"] ?? .null) == -1, "not an admin: \(started[1].serialized)")
        #expect(code(try call(as: Self.stranger, h, "ma.euid", ["appKey": "kiosk"])["result"] ?? .null) == -1)

        let r = try root.call("ma.setOwner", ["appKey": "kiosk", "uid": 65533])
        #expect(code(r) == 0 && r["ownerUid"] == 65533 && r["previous"] == 65534, "\(r.serialized)")
        let new = try call(as: Self.stranger, h, "ma.euid", ["appKey": "kiosk"])["result"] ?? .null
        #expect(code(new) == 0 && new["euid"]?.stringValue != nil, "the new owner uses it: \(new.serialized)")
        let old = try call(as: Self.nobody, h, "ma.euid", ["appKey": "kiosk"])["result"] ?? .null
        #expect(code(old) == -1, "the previous owner does not: \(old.serialized)")

        // Released: the next uid to start it claims it.
        #expect(try root.call("ma.setOwner", ["appKey": "kiosk", "uid": .null])["ownerUid"] == .null)
        #expect(code(try call(as: Self.nobody, h, "ma.start", ["appKey": "kiosk"])["result"] ?? .null) == 0)
        let st = try root.call("ma.status")
        #expect(st["appKeys"]?["kiosk"]?["ownerUid"] == 65534, "\(st.serialized)")
        #expect(st["ownerChanges"] == 2)
        #expect(code(try call(as: Self.stranger, h, "ma.euid", ["appKey": "kiosk"])["result"] ?? .null) == -1)
        #expect(code(try root.call("ma.setOwner", ["appKey": "never", "uid": 1])) == -2)
        #expect(code(try root.call("ma.setOwner", ["appKey": "kiosk", "uid": "1000"])) == -3)
        #expect(h.logText.contains("AppKey owner set") && h.logText.contains("AppKey owner released"))

        // Persisted with the AppKey.
        _ = try root.call("ma.setOwner", ["appKey": "kiosk", "uid": 65533])
        h.stop()
        try h.start()
        try h.waitForPlugin("ma")
        #expect(try h.client().call("ma.status")["appKeys"]?["kiosk"]?["ownerUid"] == 65533)
        #expect(code(try call(as: Self.nobody, h, "ma.euid", ["appKey": "kiosk"])["result"] ?? .null) == -1)
    }

    /// `bus.provide` of a callback and `push.attach` of `appId` from one connection of `uid`.
    func attach(as uid: UInt32, _ h: TestHost, _ appId: String) throws -> Int64? {
        let cb = "app\(uid).onPush"
        let r = try call(
            as: uid, h, [("bus.provide", ["method": .string(cb)]), ("push.attach", ["appId": .string(appId), "callback": .string(cb)])])
        return pcode(r[1]["result"] ?? .null)
    }

    @Test func anAdminHandsAPushAppOverAndReleasesIt() throws {
        let w = try PushWorld()
        let h = try TestHost.open(plugins: w.plugins())
        try h.waitForPlugin("push")
        let root = try h.client()
        // The client exits after each call list: the app is detached, its owner stays.
        #expect(try attach(as: Self.nobody, h, "app1") == 0)
        #expect(try attach(as: Self.stranger, h, "app1") == 3003)
        #expect(pcode(try call(as: Self.nobody, h, "push.setOwner", ["appId": "app1", "uid": 65534])["result"] ?? .null) == 3003)

        let r = try root.call("push.setOwner", ["appId": "app1", "uid": 65533])
        #expect(pcode(r) == 0 && r["ownerUid"] == 65533 && r["previous"] == 65534, "\(r.serialized)")
        #expect(try attach(as: Self.nobody, h, "app1") == 3003, "the previous owner is refused")
        #expect(try attach(as: Self.stranger, h, "app1") == 0, "the new owner attaches")

        #expect(pcode(try root.call("push.setOwner", ["appId": "app1", "uid": .null])) == 0)
        #expect(try attach(as: Self.nobody, h, "app1") == 0, "released: the next uid claims it")
        #expect(try attach(as: Self.stranger, h, "app1") == 3003)
        #expect(pcode(try root.call("push.setOwner", ["appId": "unknown", "uid": 1])) == 3002)
        #expect(try h.pushStatus()["ownerChanges"] == 2)
        #expect(h.logText.contains("appId owner set") && h.logText.contains("appId owner released"))

        _ = try root.call("push.setOwner", ["appId": "app1", "uid": 65533])
        h.stop()
        try h.start()
        try h.waitForPlugin("push")
        #expect(try attach(as: Self.nobody, h, "app1") == 3003, "persisted in push.db")
        #expect(try attach(as: Self.stranger, h, "app1") == 0)
    }

    /// uid 0 connected while `disclosure.admins` does not list it carries no admin flag: the
    /// three plugins treat it as any uid (the uploader used to treat uid 0 as an admin).
    @Test func uidZeroWithoutTheHostsAdminFlagIsNoAdmin() throws {
        let w = try PushWorld()
        var plugins = w.plugins()
        plugins.append(TestHost.maPlugins(w.backend)[1])
        let h = try TestHost.open(plugins: plugins, extra: ["disclosure": ["admins": ["uids": [4242]]]])
        for p in ["uploader", "ma", "push"] { try h.waitForPlugin(p) }
        let root = try h.client()
        // Another uid's stream, AppKey and app.
        let mine = try call(as: Self.nobody, h, [("uploader.enqueue", enqueue("n")), ("ma.start", ["appKey": "k"])])
        #expect(mine[0]["result"]?["accepted"] == 1 && code(mine[1]["result"] ?? .null) == 0, "\(mine.map(\.serialized))")
        #expect(try attach(as: Self.nobody, h, "a") == 0)

        let up = try root.request("uploader.setOwner", ["stream": "demo", "owner": "uid:0"])
        #expect(up.errorCode == -32005, "\(up.serialized)")
        #expect(try root.request("uploader.enqueue", enqueue("r")).errorCode == -32005)
        #expect(try root.call("uploader.status")["owners"] == nil, "per-owner usage is for admins")
        #expect(code(try root.call("ma.setOwner", ["appKey": "k", "uid": 0])) == -1)
        #expect(code(try root.call("ma.euid", ["appKey": "k"])) == -1)
        #expect(pcode(try root.call("push.setOwner", ["appId": "a", "uid": 0])) == 3003)
        #expect(try attach(as: 0, h, "a") == 3003)
        // Nothing changed hands.
        #expect(try call(as: Self.nobody, h, "uploader.status", nil)["result"]?["streams"]?["demo"]?["owner"] == "uid:65534")
    }
}
