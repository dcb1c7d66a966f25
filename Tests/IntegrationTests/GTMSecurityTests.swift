import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// An in-process client connected as another uid: `Tests/fixtures/uid_relay.py` runs as that
/// uid and relays a socket of its own to the host's, so the host sees the uid (SO_PEERCRED).
final class UidClient {
    let relay: Process
    private let input = Pipe()
    private let output = Pipe()
    let client: SyncClient

    init(_ host: TestHost, uid: UInt32) throws {
        let dir = NSTemporaryDirectory() + "gtm-relay-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o777])
        let path = dir + "/relay.sock"
        let script = try String(contentsOfFile: fixturesDir + "/uid_relay.py", encoding: .utf8)
        relay = Process()
        relay.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        relay.arguments = ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", "/usr/bin/python3", "-c", script, host.socket, path]
        relay.standardInput = input
        relay.standardOutput = output
        let errPath = dir + "/relay.err"
        _ = FileManager.default.createFile(atPath: errPath, contents: nil)
        relay.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: errPath))
        try relay.run()
        // The relay prints "ready" once it listens.
        var seen = Data()
        while !String(decoding: seen, as: UTF8.self).contains("ready") {
            let d = output.fileHandleForReading.availableData
            if d.isEmpty { throw TestFailure(description: "uid relay for \(uid) exited") }
            seen.append(d)
        }
        client = try SyncClient(path: path)
    }

    deinit {
        try? input.fileHandleForWriting.close()
        relay.terminate()
        relay.waitUntilExit()
    }
}

extension SyncClient {
    /// Sends a request and reads until its reply, returning the reply and every other message
    /// (incoming calls, notifications) that arrived before it, in order.
    func requestCollecting(_ method: String, _ params: JSON? = nil, id: Int64) throws -> (reply: JSON, before: [JSON]) {
        try send(envelope: Envelope.request(id: .int(id), method: method, params: .params(params)))
        var before: [JSON] = []
        while let m = try readMessage(timeoutMs: 10_000) {
            if m["id"] == .int(id) && m["method"] == nil { return (m, before) }
            before.append(m)
        }
        throw TestFailure(description: "no reply to \(method)")
    }
}

@Suite(.serialized) struct GTMSecurityTests {
    /// Issue 21 item 4 and item 12: the hostile local user (65534) of the report against a
    /// victim (4242), both unprivileged. Every step the attacker took is tried again.
    @Test func oneUidCannotReadOrChangeAnotherUidsTagManagerState() throws {
        let b = try TestBackend()
        try b.publishContainer(
            "GTM-V",
            gtmResource(
                ["title": "v1"],
                macros: [
                    ["function": "_v", "instance_name": "email", "name": "email"],
                    ["function": "_e", "instance_name": "event"],
                ],
                predicates: [["function": "_eq", "arg0": ["macro", 2], "arg1": "openScreen"]],
                tags: [["function": "_func", "name": "track", "additional_params": ["email": ["macro", 1]]]],
                rules: [[["if", 0], ["add", 0]]]))
        try b.publishContainer(
            "GTM-SPY",
            gtmResource(
                [:],
                macros: [
                    ["function": "_v", "instance_name": "email", "name": "email"],
                    ["function": "_v", "instance_name": "token", "name": "session.token"],
                ]))
        let h = try TestHost.open(plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:])))
        let victimRelay = try UidClient(h, uid: 4242)
        let attackerRelay = try UidClient(h, uid: 65534)
        defer { withExtendedLifetime((victimRelay, attackerRelay)) {} }
        let victim = victimRelay.client
        let attacker = attackerRelay.client

        // The attacker registers the victim's tag name first: in its own namespace only.
        _ = try attacker.call("bus.provide", ["method": "evil.tag"])
        #expect(try attacker.call("gtm.registerFunctionCallTag", ["name": "track", "method": "evil.tag"])["registered"] == true)
        _ = try victim.call("bus.provide", ["method": "victim.tag"])
        _ = try victim.call("bus.provide", ["method": "victim.macro"])
        #expect(try victim.call("gtm.registerFunctionCallTag", ["name": "track", "method": "victim.tag"])["registered"] == true)
        #expect(
            try victim.call("gtm.registerFunctionCallMacro", ["name": "victimSecretMacro", "method": "victim.macro"])["registered"]
                == true)

        #expect(try victim.open("GTM-V")["source"] == "network")
        _ = try victim.call("gtm.push", ["data": ["email": "victim@example.com", "session": ["token": "s3cret"]]])
        #expect(try victim.value("GTM-V", "email") == "victim@example.com")

        // Reading the victim's data layer through a container of the attacker's own.
        #expect(try attacker.open("GTM-SPY")["source"] == "network")
        #expect(try attacker.value("GTM-SPY", "email") == "")
        #expect(try attacker.value("GTM-SPY", "token") == "")
        // The victim's container, asked for by the attacker: not the victim's values.
        #expect(try attacker.request("gtm.getValue", ["containerId": "GTM-V", "key": "email"])["result"]?["value"] != "victim@example.com")
        // Overwriting the victim's keys: only the attacker's own data layer changes.
        _ = try attacker.call("gtm.push", ["data": ["email": "evil@example.com"]])
        #expect(try attacker.value("GTM-SPY", "email") == "evil@example.com")
        #expect(try victim.value("GTM-V", "email") == "victim@example.com")

        // The victim's event fires the victim's handler, with the victim's values; the
        // attacker's handler is not called (its messages up to a later reply are checked).
        // The push is answered once its tags ran: the tag's call comes before the answer.
        try victim.sendLine(#"{"jsonrpc":"2.0","id":"p1","method":"gtm.push","params":{"data":{"event":"openScreen"}}}"#)
        var tagCall: JSON?
        var pushAnswer: JSON?
        while tagCall == nil || pushAnswer == nil, let m = try victim.readMessage(timeoutMs: 5000) {
            if m["method"] == "victim.tag" { tagCall = m }
            if m["id"] == "p1" { pushAnswer = m }
        }
        #expect(pushAnswer?["result"]?["queued"] == true, "\(pushAnswer?.serialized ?? "no answer")")
        #expect(tagCall?["params"]?["parameters"]?["email"] == "victim@example.com")
        let (status, before) = try attacker.requestCollecting("gtm.status", id: 900)
        #expect(before.allSatisfy { $0["method"] != "evil.tag" }, "\(before.map(\.serialized))")
        // gtm.status shows the attacker its own handler names only (item 12), and no owners.
        #expect(status["result"]?["tagHandlers"] == ["track"])
        #expect(status["result"]?["macroHandlers"] == [])
        #expect(status["result"]?["owners"] == nil)
        #expect(status["result"]?.serialized.contains("victimSecretMacro") == false)
        #expect(status["result"]?["containers"]?.arrayValue?.map { $0["containerId"] } == ["GTM-SPY"])

        // Publishing a new version and refreshing, previewing, closing: the victim's open
        // container is not the attacker's to refresh, switch or close.
        try b.publishContainer("GTM-V", gtmResource(["title": "attacker v2"]))
        let fetches = try b.request("GET", "/v1/inspect/gtm/containers/GTM-V").json["fetches"]
        let refreshed = try attacker.request("gtm.refresh", ["containerId": "GTM-V"])
        #expect(refreshed["result"]?["accepted"] != true)
        let url = "tagmanager.c.com.example.app://preview/p?id=GTM-V&gtm_auth=x&gtm_preview=2"
        _ = try attacker.request("gtm.preview", ["url": .string(url)])
        #expect(try attacker.request("gtm.closeContainer", ["containerId": "GTM-V"])["result"]?["closed"] != true)
        #expect(try victim.value("GTM-V", "title") == "v1")
        let vs = try victim.call("gtm.status")
        #expect(vs["containers"]?.arrayValue?.first?["preview"] == false)
        #expect(vs["containers"]?.arrayValue?.first?["loading"] == false)
        #expect(try b.request("GET", "/v1/inspect/gtm/containers/GTM-V").json["fetches"] == fetches, "nothing refetched")

        // The log level and log lines: the attacker's level is its own; the victim's lines
        // reach neither the attacker's gtm.log subscription nor its gtm.logLines.
        #expect(try attacker.call("gtm.setLogLevel", ["level": "verbose"])["level"] == "verbose")
        #expect(try victim.call("gtm.status")["logLevel"] == "info")
        _ = try attacker.call("bus.subscribe", ["pattern": "gtm.*"])
        _ = try victim.value("GTM-V", "victimOnlyKey")  // an unknown macro: a warning naming it
        let (lines, heard) = try attacker.requestCollecting("gtm.logLines", id: 901)
        #expect(heard.allSatisfy { !$0.serialized.contains("victimOnlyKey") }, "\(heard.map(\.serialized))")
        #expect(lines["result"]?.serialized.contains("victimOnlyKey") == false)
        #expect(lines["result"]?.serialized.contains("victim@example.com") == false)
        #expect(try attacker.request("gtm.logLines", ["all": true]).errorCode == -32005)
        #expect(try attacker.request("gtm.getValue", ["containerId": "GTM-V", "key": "email", "uid": 4242]).errorCode == -32005)
        let own = try victim.call("gtm.logLines")
        #expect(own.serialized.contains("victimOnlyKey"))

        // An admin (root) sees every owner and may address one explicitly.
        let admin = try h.client()
        let all = try admin.call("gtm.status")
        let uids = all["owners"]?.arrayValue?.compactMap { $0["uid"]?.intValue } ?? []
        #expect(uids.contains(4242) && uids.contains(65534))
        #expect(
            try admin.call("gtm.getValue", ["containerId": "GTM-V", "key": "email"])["open"] == false, "root's own state is root's")
        #expect(
            try admin.call("gtm.getValue", ["containerId": "GTM-V", "key": "email", "uid": 4242])["value"] == "victim@example.com")
        #expect(try admin.call("gtm.logLines", ["all": true]).serialized.contains("victimOnlyKey"))
    }
}

/// Macros `m0 = "a"`, `m<i> = m<i-1> + m<i-1>` for i in 1...n (m20 is 1 MiB).
func gtmDoubling(_ n: Int) -> [JSON] {
    var macros: [JSON] = [["function": "_c", "instance_name": "m0", "value": "a"]]
    for i in 1...n {
        macros.append([
            "function": "_c", "instance_name": .string("m\(i)"),
            "value": ["template", ["macro", .int(Int64(i - 1))], ["macro", .int(Int64(i - 1))]],
        ])
    }
    return macros
}

@Suite(.serialized) struct GTMBoundsTests {
    /// Issue 21 item 5 and issue 22 item 4: expensive and huge values are answered at once with
    /// a -32004 naming the limit, and a pipeline of expensive evaluations does not hold the
    /// plugin's loop past its heartbeat.
    @Test func expensiveAndHugeValuesGetALimitErrorAndTheLoopKeepsBeating() throws {
        var macros = gtmDoubling(20)  // 0...20
        macros.append(["function": "_hsh", "arg0": ["macro", 20]])  // 21, unnamed
        macros.append([  // 22: the report's joiner
            "function": "_jn", "instance_name": "j", "arg0": .array([.string("list")] + Array(repeating: ["macro", 21], count: 30_000)),
        ])
        var distinct: [JSON] = ["list"]
        for i in 0..<12 {
            macros.append(["function": "_hsh", "arg0": ["template", ["macro", 20], .string("\(i)")]])
            distinct.append(["macro", .int(Int64(macros.count - 1))])
        }
        macros.append(["function": "_jn", "instance_name": "w", "arg0": .array(distinct)])
        let base = macros.count
        macros.append(["function": "_c", "instance_name": "l0", "value": "x"])
        for i in 1..<30 {
            macros.append([
                "function": "_c", "instance_name": .string("l\(i)"),
                "value": ["list", ["macro", .int(Int64(base + i - 1))], ["macro", .int(Int64(base + i - 1))]],
            ])
        }
        let text = JSON.object(["resource": ["version": "hog", "macros": .array(macros)]]).serialized
        let b = try TestBackend()
        var plugins = TestHost.gtmPlugins(b, defaults: try defaultsDir(["GTM-HOG": text]))
        if case .object(var o) = plugins[1] {
            o["heartbeatIntervalMs"] = 200
            o["heartbeatTimeoutMs"] = 2000
            plugins[1] = .object(o)
        }
        let h = try TestHost(plugins: plugins)
        let c = try h.client()
        _ = try c.open("GTM-HOG", "default")
        func limitOf(_ key: String) throws -> String? {
            let r = try c.request("gtm.getValue", ["containerId": "GTM-HOG", "key": .string(key)], timeoutMs: 10_000)
            #expect(r.errorCode == -32004, "\(key): \(r.serialized.prefix(200))")
            return r["error"]?["data"]?["limit"]?.stringValue
        }
        #expect(try limitOf("j") != nil)
        #expect(try limitOf("w") == "maxEvaluationBytes")
        #expect(try limitOf("m20") == "maxValueBytes", "1 MiB: over the limit, not dropped by the host")
        #expect(try limitOf("l29") != nil)
        #expect(try c.value("GTM-HOG", "m10").stringValue?.utf8.count == 1024)
        // A pipeline of the most expensive evaluation: every one answered, the plugin never
        // missed a heartbeat (it was not restarted).
        for i in 0..<60 {
            try c.sendLine(#"{"jsonrpc":"2.0","id":\#(1000 + i),"method":"gtm.getValue","params":{"containerId":"GTM-HOG","key":"w"}}"#)
        }
        var answered = 0
        while answered < 60, let m = try c.readMessage(timeoutMs: 30_000) {
            guard m["id"] != nil else { continue }
            #expect(m.errorCode == -32004, "\(m.serialized.prefix(300))")
            answered += 1
        }
        #expect(answered == 60)
        let restarts = try h.plugin("gtm")["restarts"]
        #expect(restarts == 0, "\(h.logText.split(separator: "\n").filter { $0.contains("gtm") }.suffix(8).joined(separator: "\n"))")
    }
}

@Suite(.serialized) struct GTMInputAndRestartTests {
    /// Issue 21 item 11: container ids are validated everywhere (-32602, nothing logged), and a
    /// caller repeating a failing call is rate-limited in the log.
    @Test func containerIdsAreValidatedAndRepeatedWarningsRateLimited() throws {
        let b = try TestBackend()
        let h = try TestHost(
            plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:]), gtm: ["logBurst": 20, "logLinesPerSecond": 1]))
        let c = try h.client()
        let huge = JSON.string(String(repeating: "G", count: 15_000))
        for m in ["gtm.getValue", "gtm.refresh", "gtm.closeContainer", "gtm.openContainer"] {
            #expect(try c.request(m, ["containerId": huge, "key": "k"]).errorCode == -32602, "\(m)")
        }
        #expect(try c.request("gtm.getValue", ["containerId": "../etc", "key": "k"]).errorCode == -32602)
        #expect(
            try c.request("gtm.getValue", ["containerId": "GTM-1", "key": .string(String(repeating: "k", count: 5000))]).errorCode == -32602
        )
        #expect(
            try c.call(
                "gtm.preview", ["url": .string("tagmanager.c.app://preview/p?id=\(String(repeating: "G", count: 15_000))&gtm_preview=")])[
                    "preview"] == false)
        #expect(!h.logText.contains(String(repeating: "G", count: 200)), "the unvalidated id is never logged")
        // 300 calls for a valid id that is not open: each answered, at most a burst logged.
        for i in 0..<300 {
            try c.sendLine(#"{"jsonrpc":"2.0","id":\#(5000 + i),"method":"gtm.getValue","params":{"containerId":"GTM-NOPE","key":"k"}}"#)
        }
        var answered = 0
        while answered < 300, let m = try c.readMessage(timeoutMs: 10_000) {
            if m["id"] != nil { answered += 1 }
        }
        #expect(answered == 300)
        let st = try c.call("gtm.status")
        #expect((st["logLinesSuppressed"]?.intValue ?? 0) >= 200)
        let lines = try c.call("gtm.logLines")["lines"]?.arrayValue ?? []
        #expect(lines.filter { $0["message"]?.stringValue?.contains("GTM-NOPE") == true }.count < 100)
        #expect(h.logText.components(separatedBy: "GTM-NOPE").count - 1 < 100, "the host's log got a burst, not 300 lines")
    }

    /// Issue 21 item 15 (GTM half): after a tag-manager restart a call on a container that is
    /// not open answers the type default marked `open: false` (open it again), pushes say
    /// how many containers they can fire in, and hits fired while the uploader restarts are
    /// held and sent.
    @Test func aRestartIsVisibleAndHitsSurviveAnUploaderRestart() throws {
        let b = try TestBackend()
        let res = gtmResource(
            ["title": "t"], macros: [["function": "_e", "instance_name": "event"]],
            predicates: [["function": "_eq", "arg0": ["macro", 1], "arg1": "buy"]],
            tags: [["function": "_ua", "trackingId": "UA-9"]], rules: [[["if", 0], ["add", 0]]])
        try b.publishContainer("GTM-RS", res)
        var plugins = TestHost.gtmPlugins(b, defaults: try defaultsDir([:]))
        plugins[0] = TestHost.uploader(b, config: ["streams": ["gtm.*": ["intervalMs": 100]]], ["backoffInitialMs": 1500])
        let h = try TestHost(plugins: plugins)
        let c = try h.client()
        let never = try c.call("gtm.getValue", ["containerId": "GTM-RS", "key": "title"])
        #expect(never["value"] == "" && never["open"] == false, "\(never.serialized)")
        #expect(never["reason"] == "not_open")
        _ = try c.open("GTM-RS")
        #expect(try c.value("GTM-RS", "title") == "t")
        #expect(try c.call("gtm.push", ["data": ["x": 1]])["containers"] == 1)
        let watcher = try h.client()
        _ = try watcher.call("bus.subscribe", ["pattern": "gtm.started"])
        _ = try c.call("bus.restart", ["plugin": "gtm"])
        let started = try #require(try watcher.nextNotification(timeoutMs: 10_000))
        #expect(started["method"] == "gtm.started")
        try h.waitForPlugin("gtm", restartsAtLeast: 1)
        #expect(try c.call("gtm.getValue", ["containerId": "GTM-RS", "key": "title"])["open"] == false)
        #expect(try c.call("gtm.push", ["data": ["x": 2]])["containers"] == 0)
        _ = try c.open("GTM-RS")
        #expect(try c.value("GTM-RS", "title") == "t", "re-opened: served again")

        // The uploader is killed; it comes back after its 1.5 s backoff. A hit fired meanwhile
        // reaches it once it is back: the host holds the enqueue until the uploader runs
        // (requests wait for a plugin that is starting), or the plugin holds the hit.
        let pid = try #require(try h.plugin("uploader")["pid"]?.intValue)
        kill(pid_t(pid), SIGKILL)
        try waitUntil(timeout: 5) { (try h.plugin("uploader")["state"]?.stringValue) != "running" }
        _ = try c.call("gtm.push", ["data": ["event": "buy"]])
        try waitUntil(timeout: 15) { (try b.records("gtm.hits")).count >= 1 }
        let st = try c.call("gtm.status")
        #expect(st["hitsDropped"] == 0)
        #expect(st["hitsQueued"] == 1)
        #expect(st["hitsHeld"] == 0)
    }

    /// Issue 22 item 5: `_ov` under the hardened unit's view of /proc (`ProcSubset=pid` hides
    /// /proc/sys): the plugin runs in a mount namespace with such a /proc and still reads it.
    @Test func theOSVersionMacroWorksWithoutProcSys() throws {
        let probe = Process()
        probe.executableURL = URL(fileURLWithPath: "/usr/bin/unshare")
        probe.arguments = [
            "-m", "--propagation", "private", "/bin/sh", "-c", "mount -t proc -o subset=pid proc /proc && test ! -e /proc/sys",
        ]
        try probe.run()
        probe.waitUntilExit()
        try #require(probe.terminationStatus == 0, "this machine cannot make a private mount namespace")
        let b = try TestBackend()
        let res = #"{"resource":{"version":"1","macros":[{"function":"_ov","instance_name":"os"}]}}"#
        var plugins = TestHost.gtmPlugins(b, defaults: try defaultsDir(["GTM-OS": res]))
        if case .object(var o) = plugins[1] {
            o["exec"] = "/usr/bin/unshare"
            o["args"] = [
                "-m", "--propagation", "private", "/bin/sh", "-c",
                .string("mount -t proc -o subset=pid proc /proc && test ! -e /proc/sys && exec \(binDir)/pylon-gtm"),
            ]
            plugins[1] = .object(o)
        }
        let h = try TestHost(plugins: plugins)
        let c = try h.client()
        _ = try c.open("GTM-OS", "default")
        var u = utsname()
        _ = uname(&u)
        let release = withUnsafeBytes(of: &u.release) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
        #expect(try c.value("GTM-OS", "os").stringValue == release)
    }
}
