import Foundation
import PylonClientKit
import TestSupport
import Testing

/// The authorization model (issue 11) end to end, one test per rule: principals through plugin
/// calls, host-owned caller information, the consent layers, disclosure, and the socket. Clients
/// that must be unprivileged really run as another uid (`TestHost.runAs`). The rules' cases are
/// unit-tested on the pure cores: RoutingPolicyTests (permissions, operator methods, setApp,
/// namespaces, topics, disclosure), ConsentStoreTests (layers, a damaged file), ConfigTests.
@Suite(.serialized) struct SecurityTests {
    static let rootOnlyConsent: JSONObject = [
        "permissions": [["method": "consent.set", "uids": [0]], ["method": "bus.restart", "uids": [0]]]
    ]

    func req(_ id: Int, _ method: String, _ params: JSON = [:]) -> String {
        JSON.object(["jsonrpc": "2.0", "id": .int(Int64(id)), "method": .string(method), "params": params]).serialized
    }

    /// Secure with no configuration (issue 32 item 3): with an empty `permissions` (and with
    /// none at all) every operator method is refused to a uid that is not an admin, directly and
    /// through a plugin (a plugin is no deputy: its call for a client is judged as the client's),
    /// with -32005; root and an admin listed in `disclosure.admins` may, also through the plugin;
    /// a plugin on its own may not.
    @Test func operatorMethodsAreForAdminsWithoutAnyRule() throws {
        for extra: JSONObject in [["permissions": []], [:]] {
            var config = extra
            config["disclosure"] = ["admins": ["uids": [0, 4242]]]
            let h = try TestHost.open(extra: config)
            let operatorCalls: [(String, JSON)] = [
                ("consent.set", ["key": "echo:X", "granted": false]), ("consent.set", ["key": "device", "granted": false]),
                ("consent.clear", ["key": "echo:X"]), ("bus.restart", ["plugin": "echo"]), ("bus.logLevel", ["level": "debug"]),
                ("bus.monitor", ["pattern": "*"]), ("bus.reload", [:]),
            ]
            var lines = operatorCalls.enumerated().map { req($0.offset + 1, $0.element.0, $0.element.1) }
            lines.append(req(20, "echo.call", ["method": "consent.set", "params": ["key": "echo:X", "granted": false]]))
            let refusals = lines.count
            lines.append(req(21, "consent.get", ["key": "echo:X"]))
            lines.append(req(22, "bus.ping"))
            let r = try h.runAs(uid: 65534, sequential: true, lines)
            #expect(r.replies.count == lines.count, "\(r.replies)")
            for reply in r.replies.prefix(refusals) {
                #expect(reply.errorCode == -32005, "\(extra): \(reply.serialized)")
                #expect(reply["error"]?["message"]?.stringValue?.contains("operator method") == true, "\(reply.serialized)")
            }
            #expect(r.replies.dropFirst(refusals).allSatisfy { $0["result"] != nil }, "other methods stay open: \(r.replies)")
            #expect(
                r.replies[refusals - 1]["error"]?["message"]?.stringValue?.contains("through plugin echo") == true, "judged as the client's"
            )
            let root = try h.client()
            #expect(try root.call("consent.get", ["key": "echo:X"])["granted"] == .bool(true), "nothing changed")
            #expect(try h.plugin()["restarts"] == 0)
            #expect(try h.status()["counters"]?["monitors"] == 0)
            // An admin by `disclosure.admins` may, and so may root.
            let admin = try h.runAs(uid: 4242, sequential: true, [req(0, "consent.set", ["key": "echo:X", "granted": false])])
            #expect(admin.replies.first?["result"]?["changed"] == .bool(true), "\(admin.replies)")
            #expect(try root.call("consent.clear", ["key": "echo:X"])["cleared"] == .bool(true))
            // Root may through the plugin too; a plugin acting on its own may not (no rule lists it).
            let set: JSON = ["method": "consent.set", "params": ["key": "echo:X", "granted": false]]
            #expect(try root.call("echo.call", set)["result"]?["changed"] == .bool(true))
            #expect(try root.call("consent.get", ["key": "echo:X"])["granted"] == .bool(false))
            let own = try root.roundTrip(
                req(9, "echo.callAsPlugin", ["method": "consent.set", "params": ["key": "echo:Y", "granted": false]]))
            #expect(own.errorCode == -32005)
            #expect(try root.call("bus.restart", ["plugin": "echo"])["plugin"] == "echo")
            h.stop()
        }
    }

    /// Caller information is the host's: a sender's `_pylon`, however spelled, is refused; a
    /// plugin sees the real client (uid, pid), also through another plugin; an id spelled twice, a
    /// key or method holding NUL is refused; a plugin that asks hears of a client closing.
    @Test func callerInformationCannotBeForged() throws {
        let h = try TestHost(plugins: [TestHost.echo(["env": ["PYLON_ECHO_CALLER": "1"]])])
        let c = try h.client()
        let mine = try c.call("echo.caller")
        let myId = try #require(mine["client"]?.intValue)
        #expect(mine["uid"] == .int(Int64(getuid())))
        #expect(mine["admin"] == .bool(true), "uid 0 is an admin by default")
        for forged in [
            #"{"jsonrpc":"2.0","id":1,"method":"echo.caller","_pylon":{"client":1}}"#,
            #"{"jsonrpc":"2.0","id":2,"method":"echo.caller","params":{},"\u005fpylon":{"client":1}}"#,
            #"{"jsonrpc":"2.0","id":3,"method":"echo.caller","_onBehalfOf":1}"#,
        ] {
            let r = try c.roundTrip(forged)
            #expect(r.errorCode == -32600, "\(forged) → \(r.serialized)")
        }
        // Through the plugin: the inner request names the plugin and the client it acts for.
        let via = try c.call("echo.call", ["method": "echo.caller"])["result"]
        #expect(via?["plugin"] == .string("echo"))
        #expect(via?["client"]?.intValue == myId)
        // A plugin naming a request it does not serve is refused: simulated by a plugin-made
        // call after its request was answered is not reachable from here, so check the rule's
        // other half: a plugin's own call carries no client.
        let own = try c.call("echo.callAsPlugin", ["method": "echo.caller"])["result"]
        #expect(own == ["plugin": "echo"])
        #expect(mine["pid"] == .int(Int64(getpid())))
        #expect(try c.call("echo.echo", ["x": 1]) == ["x": 1], "the extra member does not disturb params")

        // The host splices its own id over the client's; json-c decodes escaped keys and cuts keys
        // at U+0000, a byte search does neither. A second "id" spelled with escapes would stay in
        // the forwarded line and be the id the plugin answers to (another client's pending
        // request, or `_onBehalfOf` as that client); a key with U+0000 is one member to json-c and
        // another to other parsers. Both are refused; one id written with escapes still works.
        let ok = try c.roundTrip(#"{"jsonrpc":"2.0","i\u0064":5,"method":"echo.echo","params":{"a":1}}"#)
        #expect(ok["id"] == .int(5) && ok["result"] == ["a": 1], "\(ok.serialized)")
        for bad in [
            #"{"jsonrpc":"2.0","id":"A-7","method":"echo.echo","params":{},"i\u0064":7}"#,
            #"{"jsonrpc":"2.0","i\u0064":7,"method":"echo.echo","params":{},"id":8}"#,
            #"{"jsonrpc":"2.0","id":9,"method":"echo.echo","id\u0000x":10}"#,
            #"{"jsonrpc":"2.0","id":11,"method":"echo.echo","params":{"consent":"a","consent\u0000":"b"}}"#,
            // A method name with a NUL is refused, not routed by the part before it.
            #"{"jsonrpc":"2.0","id":12,"method":"echo.echo\u0000.x","params":[1]}"#,
            #"{"jsonrpc":"2.0","id":13,"method":"echo echo","params":[1]}"#,
        ] {
            let r = try c.roundTrip(bad)
            #expect(r.errorCode == -32600, "\(bad) → \(r.serialized)")
        }
        #expect(try c.call("echo.echo", ["still": true]) == ["still": true])

        // A plugin that asks is told when a client goes.
        var gone: SyncClient? = try h.client()
        let goneId = try #require(try gone!.call("echo.caller")["client"]?.intValue)
        gone = nil
        try waitUntil(timeout: 5) { try c.call("echo.closedClients").arrayValue?.contains(.int(goneId)) == true }
    }

    /// The operator's denial holds whatever an app says; an app can only narrow.
    @Test func anAppCannotRegrantWhatTheOperatorDenied() throws {
        let h = try TestHost()
        let c = try h.client()
        _ = try c.call("consent.set", ["key": "echo:V", "granted": false])
        let regrant = try c.call("echo.callAsPlugin", ["method": "consent.setApp", "params": ["key": "echo:V", "granted": true]])
        #expect(regrant["result"]?["granted"] == .bool(false))
        #expect(try c.call("consent.get", ["key": "echo:V"])["granted"] == .bool(false))
        #expect(try c.roundTrip(req(4, "echo.collect", ["appKey": "V"])).errorCode == -32003)
        // The app layer narrows a granted switch, only in the plugin's own namespace, and a
        // client cannot use it.
        _ = try c.call("echo.callAsPlugin", ["method": "consent.setApp", "params": ["key": "echo:W", "granted": false]])
        #expect(try c.call("consent.get", ["key": "echo:W"])["granted"] == .bool(false))
        #expect(
            try c.roundTrip(req(5, "echo.callAsPlugin", ["method": "consent.setApp", "params": ["key": "ma:W", "granted": false]]))
                .errorCode == -32005)
        #expect(try c.roundTrip(req(6, "consent.setApp", ["key": "echo:W", "granted": true])).errorCode == -32005)
        #expect(
            try c.roundTrip(req(7, "echo.callAsPlugin", ["method": "consent.setApp", "params": ["key": "device", "granted": false]]))
                .errorCode == -32005)
    }

    /// MA's `start {dataCollectionEnabled: true}` no longer re-grants a switch root denied.
    @Test func maStartCannotRegrantAnOperatorDenial() throws {
        let b = try TestBackend()
        let h = try TestHost.open(plugins: TestHost.maPlugins(b), extra: SecurityTests.rootOnlyConsent)
        let root = try h.client()
        _ = try root.call("consent.set", ["key": "ma:victim", "granted": false])
        let r = try h.runAs([req(1, "ma.start", ["appKey": "victim", "dataCollectionEnabled": true])])
        #expect(r.replies.first?["result"]?["code"]?.intValue == 0)
        #expect(try root.call("consent.get", ["key": "ma:victim"])["granted"] == .bool(false))
        #expect(try root.call("consent.get", ["key": "ma:victim"])["explicit"] == .bool(false))
    }

    /// An event answered 0 is durable: a switch-off sent right behind it on the same connection
    /// waits for it, and it (and the session start) reaches the backend as the final batch.
    @Test func anEventAnsweredZeroSurvivesASwitchOffRightBehindIt() throws {
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.maPlugins(b))
        let c = try h.client()
        try c.sendLine(req(1, "ma.start", ["appKey": "race"]))
        try c.sendLine(req(2, "ma.eventRecord", ["eventName": "purchase", "property": ["sku": "A-1"]]))
        try c.sendLine(req(3, "ma.setDataCollectionEnabled", ["enabled": false]))
        var order: [Int64] = []
        for _ in 0..<3 {
            let m = try #require(try c.readMessage(timeoutMs: 10000))
            #expect(m["result"]?["code"] == .int(0), "\(m.serialized)")
            order.append(m["id"]?.intValue ?? -1)
        }
        #expect(order.last == 3, "the switch-off is answered after the event: \(order)")
        try waitUntil(timeout: 15) {
            let names = try b.records("ma.race").compactMap { $0["data"]?["event"]?.stringValue }
            return names.contains("purchase") && names.contains("el_session_start")
        }
        #expect(try c.call("consent.get", ["key": "ma:race"])["granted"] == .bool(false))
    }

    /// Who sees what: an unprivileged client sees only its own entry in bus.status, only the
    /// master switch of `consent.list` and `bus.status`, only its own provided methods in
    /// `bus.describe`, and cannot claim a plugin's namespace or publish in one; an admin sees
    /// everything, the unprivileged client's closing included (a host topic: admins only,
    /// RoutingPolicyTests.adminTopicsReachAdminsOnly).
    @Test func unprivilegedClientsSeeOnlyTheirOwn() throws {
        let h = try TestHost.open()
        let root = try h.client()
        _ = try root.call("consent.set", ["key": "ma:victimapp", "granted": false])
        _ = try root.call("bus.provide", ["method": "rootsvc.secret"])
        _ = try root.call("bus.subscribe", ["pattern": "*"])
        // Sequential: each line's id is its index.
        let r = try h.runAs(
            sequential: true,
            [
                req(0, "bus.subscribe", ["pattern": "*"]), req(1, "bus.status"),
                req(2, "bus.provide", ["method": "push.register"]), req(3, "bus.provide", ["method": "echo.echo"]),
                req(4, "bus.publish", ["topic": "push.message", "data": ["x": 1]]),
                req(5, "bus.provide", ["method": "mysvc.hello"]), req(6, "consent.list"), req(7, "bus.describe"),
                req(8, "bus.status"), req(9, "consent.get", ["key": "device"]),
            ])
        let status = try #require(r.replies.first { $0["id"] == .int(1) }?["result"])
        #expect(status["clients"]?.arrayValue?.count == 1, "\(status["clients"]?.serialized ?? "")")
        #expect(status["clients"]?.arrayValue?.first?["uid"] == .int(65534))
        #expect((status["clients_total"]?.intValue ?? 0) >= 2)
        #expect(r.replies.first { $0["id"] == .int(2) }?.errorCode == -32005, "reserved namespace, not configured")
        #expect(r.replies.first { $0["id"] == .int(3) }?.errorCode == -32005, "a configured plugin's namespace")
        #expect(r.replies.first { $0["id"] == .int(4) }?.errorCode == -32005)
        let list = try #require(r.replies.first { $0["id"] == .int(6) }?["result"])
        #expect(list["switches"]?.objectValue?.keys.contains("ma:victimapp") == false, "\(list.serialized)")
        #expect(list["operator"]?.objectValue?.keys.contains("ma:victimapp") == false)
        #expect(!list.serialized.contains("victimapp"))
        let described = try #require(r.replies.first { $0["id"] == .int(7) }?["result"])
        #expect(described["provided"]?["rootsvc.secret"] == nil, "\(described["provided"]?.serialized ?? "")")
        #expect(described["provided"]?["mysvc.hello"] != nil, "its own")
        let later = try #require(r.replies.first { $0["id"] == .int(8) }?["result"])
        #expect(!later["consent"]!.serialized.contains("victimapp"))
        #expect(r.replies.first { $0["id"] == .int(9) }?["result"]?["granted"] == .bool(true))
        // An admin sees everything, and the unprivileged client's closing.
        #expect(try root.call("consent.list")["operator"]?["ma:victimapp"] == .bool(false))
        #expect(try root.call("bus.describe")["provided"]?["rootsvc.secret"] != nil)
        try waitUntil(timeout: 5) {
            guard let n = try root.nextNotification(timeoutMs: 200) else { return false }
            return n["method"] == .string("bus.client.closed")
        }
    }

    /// A second pylond on a live socket refuses to start and leaves the first one serving.
    @Test func aSecondHostDoesNotTakeOverALiveSocket() throws {
        let h = try TestHost()
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylond")
        p.arguments = ["--config", h.configPath]
        let err = Pipe()
        p.standardError = err
        p.standardOutput = FileHandle.nullDevice
        var env = ProcessInfo.processInfo.environment
        env["PYLON_SOCKET"] = nil
        env["PYLON_STATE_DIR"] = h.dir + "/state2"
        p.environment = env
        try p.run()
        let out = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        #expect(p.terminationStatus != 0)
        #expect(out.contains("is served by process"), "names the live pid: \(out)")
        #expect(try h.client().call("echo.echo", [7]) == [7], "the first host still serves its socket")
    }
}
