import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

extension TestHost {
    /// The gtm plugin (and the uploader, for hits) against `backend`, defaults from `defaults`.
    static func gtmPlugins(_ backend: TestBackend, defaults: String, gtm extra: JSONObject = [:]) -> [JSON] {
        var config: JSONObject = [
            "backend": .string(backend.baseURL), "credentialFile": .string(backend.credentialFile), "defaultsDir": .string(defaults),
            "logLevel": "info",
            "fetchTimeoutMs": 3000,
        ]
        for (k, v) in extra { config[k] = v }
        return [
            uploader(backend, config: ["streams": ["gtm.*": ["intervalMs": 100]]]),
            ["name": "gtm", "exec": "pylon-gtm", "backoffInitialMs": 50, "config": .object(config)],
        ]
    }
}

extension TestBackend {
    /// Publishes (or drafts) a container version through the admin API.
    @discardableResult
    func publishContainer(_ id: String, _ resource: JSON, draft: Bool = false, auth: String? = nil) throws -> JSON {
        var body: JSONObject = ["container": ["resource": resource], "draft": .bool(draft)]
        if let auth { body["gtmAuth"] = .string(auth) }
        let r = try request("POST", "/v1/admin/gtm/containers/\(id)/versions", body: .object(body))
        guard r.status == 200 else { throw TestFailure(description: "publish failed: \(r.status) \(r.json.serialized)") }
        return r.json
    }
}

/// A resource with constant values (`key` → value) and optional extra macros/predicates/tags/rules.
func gtmResource(_ values: JSONObject, macros: [JSON] = [], predicates: [JSON] = [], tags: [JSON] = [], rules: [JSON] = []) -> JSON {
    var ms: [JSON] = values.map { ["function": "_c", "instance_name": .string($0.key), "value": $0.value] }
    ms += macros
    return ["macros": .array(ms), "predicates": .array(predicates), "tags": .array(tags), "rules": .array(rules)]
}

/// A temporary directory of default containers.
func defaultsDir(_ files: [String: String]) throws -> String {
    let dir = NSTemporaryDirectory() + "gtm-defaults-" + UUID().uuidString.prefix(8)
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    for (name, text) in files { try text.write(toFile: dir + "/" + name, atomically: true, encoding: .utf8) }
    return dir
}

func plistXML(_ pairs: [(String, String)]) -> String {
    """
    <?xml version="1.0" encoding="UTF-8"?>
    <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
    <plist version="1.0"><dict>\(pairs.map { "<key>\($0.0)</key>\($0.1)" }.joined())</dict></plist>
    """
}

extension SyncClient {
    func value(_ id: String, _ key: String, _ type: String = "string") throws -> JSON {
        try call("gtm.getValue", ["containerId": .string(id), "key": .string(key), "type": .string(type)])["value"] ?? .null
    }
    func open(_ id: String, _ type: String = "prefer_non_default", timeoutMs: Int = 2000) throws -> JSON {
        try call("gtm.openContainer", ["containerId": .string(id), "openType": .string(type), "timeoutMs": .int(Int64(timeoutMs))])
    }
}

@Suite(.serialized) struct GTMPluginTests {
    @Test func defaultContainerPrecedence() throws {
        let full = #"{"resource":{"version":"d1","macros":[{"function":"_c","instance_name":"title","value":"from full"}]}}"#
        let dir = try defaultsDir([
            "GTM-A": full, "GTM-A.plist": plistXML([("title", "<string>from plist</string>")]), "GTM-A.json": #"{"title":"from json"}"#,
            "GTM-B.plist": plistXML([
                ("title", "<string>from plist</string>"), ("n", "<integer>-5</integer>"), ("on", "<true/>"),
                ("ratio", "<real>2.5</real>"),
            ]),
            "GTM-B.json": #"{"title":"from json"}"#,
            "GTM-C.json": #"{"title":"from json","nested":{"a":[1,2]},"n":"12.75"}"#,
            "GTM-D.json": #"{"title":["no"]}"#,
        ])
        // A binary property list (plistlib FMT_BINARY) wins over its JSON sibling too.
        let binary =
            "YnBsaXN0MDDVAQIDBAUGBwgLDFFuU25lZ1ZuZXN0ZWRSb25VdGl0bGUQKhP//////////dEJClFhEAEIXxARZnJvbSBiaW5hcnkgcGxpc3QIExUZICMpKzQ3OTs8AAAAAAAAAQEAAAAAAAAADQAAAAAAAAAAAAAAAAAAAFA="
        try Data(base64Encoded: binary)!.write(to: URL(fileURLWithPath: dir + "/GTM-E.plist"))
        try #"{"title":"from json"}"#.write(toFile: dir + "/GTM-E.json", atomically: true, encoding: .utf8)
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: dir))
        let c = try h.client()
        for id in ["GTM-A", "GTM-B", "GTM-C", "GTM-D", "GTM-E"] {
            let r = try c.open(id)
            #expect(r["isDefault"] == true, "no published version: the network fails and the default stays")
            #expect(r["source"] == "default")
        }
        #expect(try c.value("GTM-A", "title") == "from full")
        #expect(try c.value("GTM-B", "title") == "from plist")
        #expect(try c.value("GTM-B", "n", "int64") == -5)
        #expect(try c.value("GTM-B", "on", "bool") == true)
        #expect(try c.value("GTM-B", "ratio", "double") == 2.5)
        #expect(try c.value("GTM-C", "title") == "from json")
        #expect(try c.value("GTM-E", "title") == "from binary plist")
        #expect(try c.value("GTM-E", "n", "int64") == 42)
        #expect(try c.value("GTM-E", "neg", "int64") == -3)
        #expect(try c.value("GTM-E", "on", "bool") == false)
        #expect(try c.value("GTM-E", "nested") == #"{"a":1}"#)
        #expect(try c.value("GTM-C", "n", "int64") == 12)
        #expect(try c.value("GTM-C", "nested") == #"{"a":[1,2]}"#)
        #expect(try c.value("GTM-D", "title") == "", "an array at the top level is rejected: empty container")
        #expect(try c.value("GTM-C", "missing", "bool") == false)
        #expect(try c.value("GTM-C", "missing", "double") == .double(0))
        #expect(h.logText.contains("GTM-D.json") && h.logText.contains("array"))
    }

    @Test func openerWithFastSlowAndFailingBackends() throws {
        let b = try TestBackend()
        try b.publishContainer("GTM-N", gtmResource(["title": "network v1"]))
        let dir = try defaultsDir(["GTM-N.json": #"{"title":"default"}"#])
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: dir))
        let c = try h.client()
        // Fast backend: prefer_non_default gets the network container.
        let r = try c.open("GTM-N")
        #expect(r["isDefault"] == false)
        #expect(r["source"] == "network")
        #expect(r["version"] == "1")
        #expect(try c.value("GTM-N", "title") == "network v1")

        // Slow backend: a fresh id times out with the default container.
        let dir2 = try defaultsDir(["GTM-S.json": #"{"title":"default"}"#])
        try b.publishContainer("GTM-S", gtmResource(["title": "slow network"]))
        let h2 = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: dir2))
        let c2 = try h2.client()
        try b.faults(["latencyMs": 1500])
        // The network answers at 1.5 s: the default means the opener's 300 ms released it.
        let slow = try c2.open("GTM-S", "prefer_fresh", timeoutMs: 300)
        #expect(slow["isDefault"] == true)
        #expect(try c2.value("GTM-S", "title") == "default")
        try waitUntil(timeout: 5) { try c2.value("GTM-S", "title") == "slow network" }
        try b.clearFaults()

        // Failing backend: a network failure releases the opener at once with the default.
        let dir3 = try defaultsDir(["GTM-F.json": #"{"title":"default"}"#])
        let h3 = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: dir3))
        let c3 = try h3.client()
        try b.faults(["failNext": 3, "status": 503])
        // An opener's wait of 10 min, past the host's request timeout: an answer at all means
        // the failure released it (no clock needed).
        let failed = try c3.open("GTM-F", "prefer_fresh", timeoutMs: 600_000)
        #expect(failed["isDefault"] == true)
        try b.clearFaults()

        // Low-level open returns at once with the default and loads in the background.
        let low = try c3.open("GTM-N", "default")
        #expect(low["isDefault"] == true)
        try waitUntil(timeout: 5) { try c3.value("GTM-N", "title") == "network v1" }
        // Opening an open id returns the open one.
        #expect(try c3.open("GTM-N")["source"] == "network")
    }

    @Test func savedContainerETagAndRefreshLimit() throws {
        let b = try TestBackend()
        try b.publishContainer("GTM-R", gtmResource(["title": "v1"]))
        let dir = try defaultsDir([:])
        let state = NSTemporaryDirectory() + "gtm-state-" + UUID().uuidString.prefix(8)
        do {
            let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: dir), stateDir: state)
            let c = try h.client()
            _ = try c.call("bus.subscribe", ["pattern": "gtm.container.*"])
            #expect(try c.open("GTM-R")["source"] == "network")
            // Manual refresh: accepted, then the unchanged container costs a 304.
            #expect(try c.call("gtm.refresh", ["containerId": "GTM-R"])["accepted"] == true)
            try waitUntil(timeout: 5) {
                (try b.request("GET", "/v1/inspect/gtm/containers/GTM-R").json["fetches"]?["notModified"]?.intValue ?? 0) == 1
            }
            // Within 5 s of the last accepted one: ignored, and the caller is told why.
            let again = try c.call("gtm.refresh", ["containerId": "GTM-R"])
            #expect(again["accepted"] == false)
            #expect(again["reason"]?.stringValue?.contains("rate_limited") == true)
            #expect(try c.call("gtm.refresh", ["containerId": "nope"])["accepted"] == false)
            h.stop()
        }
        // Restart with the backend failing: the saved copy is used (fresh: released by saved success).
        try b.faults(["failNext": 100, "status": 503])
        let h2 = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: dir), stateDir: state)
        let c2 = try h2.client()
        let r = try c2.open("GTM-R", "prefer_fresh", timeoutMs: 3000)
        #expect(r["source"] == "saved")
        #expect(r["isDefault"] == false)
        #expect(r["stale"] == false)
        #expect(try c2.value("GTM-R", "title") == "v1")
        try b.clearFaults()
    }

    @Test func previewEnterAndLeave() throws {
        let b = try TestBackend()
        try b.publishContainer("GTM-P", gtmResource(["title": "published"]))
        try b.publishContainer("GTM-P", gtmResource(["title": "draft"]), draft: true, auth: "tok3n")
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:])))
        let c = try h.client()
        #expect(try c.call("gtm.preview", ["url": "https://example.com"])["preview"] == false)
        #expect(
            try c.call("gtm.preview", ["url": "tagmanager.c.com.example.app://preview/p?id=GTM-P&gtm_auth=tok3n&gtm_preview=2"])["preview"]
                == true)
        let r = try c.open("GTM-P")
        #expect(r["preview"] == true)
        #expect(try c.value("GTM-P", "title") == "draft")
        #expect(try c.call("gtm.preview", ["url": "tagmanager.c.com.example.app://preview/p?id=GTM-P&gtm_preview="])["preview"] == true)
        try waitUntil(timeout: 5) { try c.value("GTM-P", "title") == "published" }
        let inspect = try b.request("GET", "/v1/inspect/gtm/containers/GTM-P").json
        #expect(inspect["fetches"]?["draft"] == 1)
        // A wrong token is refused by the backend (the container stays as it was).
        #expect(try b.request("GET", "/v1/gtm/containers/GTM-P/draft?gtm_auth=bad&gtm_preview=2").status == 403)
    }

    @Test func dataLayerMergeAndLifetimeAcrossRestart() throws {
        let b = try TestBackend()
        let res = gtmResource(
            [:],
            macros: [
                ["function": "_v", "instance_name": "level", "name": "user.level"],
                ["function": "_v", "instance_name": "color", "name": "user.prefs.color"],
                ["function": "_v", "instance_name": "temp", "name": "temp"],
            ])
        try b.publishContainer("GTM-DL", res)
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:]), gtm: ["maxDataLayerBytes": 65536]))
        let c = try h.client()
        _ = try c.open("GTM-DL")
        #expect(try c.call("gtm.push", ["data": ["user": ["prefs": ["color": "red"]], "temp": "x"]])["queued"] == true)
        _ = try c.call("gtm.push", ["data": ["user.level": 5, "gtm.lifetime": "1h"]])
        // A key of more dotted parts than levels the data layer nests: refused, the plugin alive.
        let deep = Array(repeating: "a", count: 100_000).joined(separator: ".")
        #expect(try c.request("gtm.push", ["data": [deep: 1]]).errorCode == -32602)
        // The data layer is bounded in all (maxDataLayerBytes 64 KiB here): new keys past it are refused.
        var full: JSON?
        for i in 0..<40 {
            let r = try c.request("gtm.push", ["data": ["k\(i)": .string(String(repeating: "v", count: 4000))]])
            if r["error"] != nil { full = r; break }
        }
        #expect(full?.errorCode == -32004 && full?["error"]?["data"]?["limit"] == "maxDataLayerBytes")
        #expect(try c.value("GTM-DL", "level", "int64") == 5)
        #expect(try c.value("GTM-DL", "color") == "red", "deep merge keeps earlier keys")
        #expect(try c.value("GTM-DL", "temp") == "x")
        _ = try c.call("bus.restart", ["plugin": "gtm"])
        try h.waitForPlugin("gtm", restartsAtLeast: 1)
        _ = try c.open("GTM-DL")
        #expect(try c.value("GTM-DL", "level", "int64") == 5, "gtm.lifetime values survive a restart")
        #expect(try c.value("GTM-DL", "temp") == "", "other values do not")
    }

    /// `gtm.lifetime` values are one frame appended to `gtm.lifetime` when the push is handled:
    /// a kill -9 of the plugin right after keeps them (issue 24 item 3).
    @Test func gtmLifetimeValuesSurviveAKill9OfThePlugin() throws {
        let b = try TestBackend()
        try b.publishContainer("GTM-K9", gtmResource([:], macros: [["function": "_v", "instance_name": "level", "name": "user.level"]]))
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:])))
        let c = try h.client()
        _ = try c.open("GTM-K9")
        _ = try c.call("gtm.push", ["data": ["user.level": 7, "gtm.lifetime": "1h"]])
        _ = try c.call("gtm.push", ["data": ["user.level": 8, "gtm.lifetime": "1h"]])
        #expect(try c.value("GTM-K9", "level", "int64") == 8)
        let pid = try #require(try h.plugin("gtm")["pid"]?.intValue)
        kill(Int32(pid), SIGKILL)
        try h.waitForPlugin("gtm", restartsAtLeast: 1)
        _ = try c.open("GTM-K9")
        #expect(try c.value("GTM-K9", "level", "int64") == 8, "the last persisted value, after a kill -9")
    }

    @Test func functionCallTagsAndMacrosThroughAProvidedMethod() throws {
        let b = try TestBackend()
        let res = gtmResource(
            [:],
            macros: [
                ["function": "_e", "instance_name": "event"],
                ["function": "_v", "instance_name": "screen", "name": "screenName"],
                [
                    "function": "_func", "instance_name": "price", "function_call_macro_name": "priceFor",
                    "additional_params": ["sku": ["macro", 1]],
                ],
            ], predicates: [["function": "_eq", "arg0": ["macro", 0], "arg1": "openScreen"]],
            tags: [["function": "_func", "name": "track", "additional_params": ["screen": ["macro", 1]]]],
            rules: [[["if", 0], ["add", 0]]])
        try b.publishContainer("GTM-F", res)
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:]), gtm: ["functionCallTimeoutMs": 500]))
        var appConn: SyncClient? = try h.client()
        _ = try appConn!.call("bus.provide", ["method": "app.fn.tag"])
        _ = try appConn!.call("bus.provide", ["method": "app.fn.macro"])
        #expect(try appConn!.call("gtm.registerFunctionCallTag", ["name": "track", "method": "app.fn.tag"])["registered"] == true)
        #expect(try appConn!.call("gtm.registerFunctionCallMacro", ["name": "priceFor", "method": "app.fn.macro"])["registered"] == true)
        let c = try h.client()
        // Another connection can neither take a registered name nor name a method it does not serve.
        _ = try c.call("bus.provide", ["method": "evil.fn"])
        #expect(try c.request("gtm.registerFunctionCallTag", ["name": "track", "method": "evil.fn"]).errorCode == -32005)
        #expect(try c.request("gtm.registerFunctionCallMacro", ["name": "x", "method": "consent.set"]).errorCode == -32005)
        #expect(try c.request("gtm.registerFunctionCallMacro", ["name": "y", "method": "app.fn.macro"]).errorCode == -32005)
        // An event pushed before the container is open fires nothing in it.
        _ = try c.call("gtm.push", ["data": ["event": "openScreen", "screenName": "Early"]])
        _ = try c.open("GTM-F")
        _ = try c.call("gtm.push", ["data": ["event": "openScreen", "screenName": "Home"]])
        let tagCall = try #require(try appConn!.readMessage(timeoutMs: 5000))
        #expect(tagCall["method"] == "app.fn.tag")
        #expect(tagCall["params"]?["name"] == "track")
        #expect(tagCall["params"]?["parameters"] == ["screen": "Home"], "not the early push")
        try appConn!.send(envelope: Envelope.result(id: .value(tagCall["id"]!), .value(["ok": true])))
        // A function-call macro: the value comes from the app.
        try c.sendLine(#"{"jsonrpc":"2.0","id":77,"method":"gtm.getValue","params":{"containerId":"GTM-F","key":"price","type":"double"}}"#)
        let macroCall = try #require(try appConn!.readMessage(timeoutMs: 5000))
        #expect(macroCall["method"] == "app.fn.macro")
        #expect(macroCall["params"]?["parameters"] == ["sku": "Home"])
        try appConn!.send(envelope: Envelope.result(id: .value(macroCall["id"]!), .value(["value": 9.5])))
        #expect(try #require(try c.readMessage(timeoutMs: 5000))["result"]?["value"] == 9.5)
        // A slow handler: the type default after the bounded wait.
        try c.sendLine(#"{"jsonrpc":"2.0","id":78,"method":"gtm.getValue","params":{"containerId":"GTM-F","key":"price","type":"double"}}"#)
        _ = try #require(try appConn!.readMessage(timeoutMs: 5000))
        // The handler never answers: the answer (the type default) comes from the bounded wait.
        #expect(try #require(try c.readMessage(timeoutMs: 10_000))["result"]?["value"] == .double(0))
        // The registering client goes away: its handlers are forgotten.
        appConn = nil
        _ = appConn
        try waitUntil(timeout: 5) { try c.call("gtm.status")["macroHandlers"] == [] }
        #expect(try c.value("GTM-F", "price", "double") == .double(0))
    }

    @Test func hitsReachTheBackendOnlyWhileConsentIsGranted() throws {
        let b = try TestBackend()
        let res = gtmResource(
            [:], macros: [["function": "_e", "instance_name": "event"]],
            predicates: [["function": "_eq", "arg0": ["macro", 0], "arg1": "purchase"]],
            tags: [["function": "_ua", "trackingId": "UA-1", "eventAction": ["macro", 0]]],
            rules: [[["if", 0], ["add", 0]]])
        try b.publishContainer("GTM-H", res)
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:])))
        let c = try h.client()
        _ = try c.open("GTM-H")
        _ = try c.call("consent.set", ["key": "gtm:hits", "granted": false])
        _ = try c.call("gtm.push", ["data": ["event": "purchase", "n": 1]])
        try waitUntil(timeout: 5) { (try c.call("gtm.status")["hitsDroppedForConsent"]?.intValue ?? 0) >= 1 }
        _ = try c.call("consent.set", ["key": "gtm:hits", "granted": true])
        let before = try c.call("gtm.status")
        _ = try c.call("gtm.push", ["data": ["event": "purchase", "n": 2]])
        _ = try c.call("gtm.push", ["data": ["event": "other"]])
        // Both pushes handled; the purchase fired its tag, the other event none.
        try waitUntil(timeout: 10) { try c.call("gtm.status")["pushesHandled"] == before["pushes"].map { .int(($0.intValue ?? 0) + 2) } }
        let after = try c.call("gtm.status")
        #expect(after["tagsFired"]?.intValue == (before["tagsFired"]?.intValue ?? 0) + 1, "\(after.serialized)")
        try waitUntil(timeout: 10) { try c.call("gtm.status")["hitsQueued"]?.intValue == (before["hitsQueued"]?.intValue ?? 0) + 1 }
        _ = try c.call("uploader.flush", ["stream": "gtm.hits", "wait": true])
        let recs = try b.records("gtm.hits")
        #expect(recs.count == 1)
        #expect(recs.first?["data"]?["tag"]?["trackingId"] == "UA-1")
        #expect(recs.first?["data"]?["event"] == "purchase")
        #expect(recs.first?["data"]?["containerId"] == "GTM-H")
        // The container's own switch: denied, its hits are not sent even with gtm:hits granted.
        let dropped = try c.call("gtm.status")["hitsDroppedForConsent"]?.intValue ?? 0
        _ = try c.call("consent.set", ["key": "gtm:GTM-H", "granted": false])
        _ = try c.call("gtm.push", ["data": ["event": "purchase", "n": 3]])
        try waitUntil(timeout: 5) { (try c.call("gtm.status")["hitsDroppedForConsent"]?.intValue ?? 0) == dropped + 1 }
        _ = try c.call("uploader.flush", ["stream": "gtm.hits", "wait": true])
        #expect(try b.records("gtm.hits").count == 1)
    }

    @Test func secondContainerIsIsolated() throws {
        let b = try TestBackend()
        try b.publishContainer("GTM-1", gtmResource(["title": "one", "only1": true]))
        try b.publishContainer("GTM-2", gtmResource(["title": "two"]))
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: try defaultsDir([:])))
        let c = try h.client()
        _ = try c.open("GTM-1")
        _ = try c.open("GTM-2")
        #expect(try c.value("GTM-1", "title") == "one")
        #expect(try c.value("GTM-2", "title") == "two")
        #expect(try c.value("GTM-2", "only1", "bool") == false)
        #expect(try c.call("gtm.closeContainer", ["containerId": "GTM-1"])["closed"] == true)
        let closed = try c.call("gtm.getValue", ["containerId": "GTM-1", "key": "title"])
        #expect(closed["value"] == "" && closed["open"] == false, "closed: the type default, marked not open")
        #expect(try c.value("GTM-2", "title") == "two")
        #expect(try c.call("gtm.setLogLevel", ["level": "verbose"])["level"] == "verbose")
        #expect(throws: (any Error).self) { try c.call("gtm.setLogLevel", ["level": "loud"]) }
        // The caller's own log lines: gtm.logLines, read from a sequence number on.
        let since = try c.call("gtm.logLines")["next"]?.intValue ?? 0
        _ = try c.value("GTM-2", "nope")  // an unknown macro: a warning
        let lines = try c.call("gtm.logLines", ["since": .int(since)])
        #expect(lines["lines"]?.arrayValue?.contains { $0["message"]?.stringValue?.contains("nope") == true } == true)
        #expect(lines["lines"]?.arrayValue?.first?["uid"] == .int(0))
        _ = try c.call("gtm.setLogLevel", ["level": "none"])
    }

    @Test func largeAndHostileContainersLoadWithoutStallingTheLoop() throws {
        // ~1 MB: thousands of macros, predicates, tags and rules, many unknown function ids.
        var macros: [JSON] = [], preds: [JSON] = [], tags: [JSON] = [], rules: [JSON] = []
        for i in 0..<3000 {
            macros.append([
                "function": i % 10 == 0 ? .string("_unknown\(i)") : "_c", "instance_name": .string("k\(i)"),
                "value": .string("value-\(i)-" + String(repeating: "x", count: 120)),
            ])
            preds.append(["function": "_eq", "arg0": ["macro", .int(Int64(i))], "arg1": .string("v\(i)")])
            tags.append(["function": "_func", "name": .string("t\(i)")])
            rules.append([["if", .int(Int64(i))], ["add", .int(Int64(i))]])
        }
        let big = JSON.object([
            "resource": [
                "version": "big", "macros": .array(macros), "predicates": .array(preds), "tags": .array(tags), "rules": .array(rules),
            ]
        ])
        let text = big.serialized
        #expect(text.utf8.count > 700_000)
        // Hostile: cycles, out-of-range references, catastrophic regexes.
        let hostile = JSON.object([
            "resource": [
                "macros": [
                    ["function": "_c", "instance_name": "a", "value": ["macro", 1]],
                    ["function": "_c", "instance_name": "b", "value": ["macro", 0]],
                    ["function": "_c", "instance_name": "bad", "value": ["macro", 99]],
                    ["function": "_c", "instance_name": "evil", "value": .string(String(repeating: "a", count: 5000) + "!")],
                    ["function": "_c", "instance_name": "ok", "value": "fine", "not_default_macro": true],
                ],
                "predicates": [
                    ["function": "_re", "arg0": ["macro", 3], "arg1": "^(a+)+$"],
                    ["function": "_re", "arg0": ["macro", 3], "arg1": "(a|aa)*c"],
                ],
                "rules": [[["if", 0, 1], ["add_macro", 4]], [["if", 7]]],
            ]
        ]).serialized
        let dir = try defaultsDir(["GTM-BIG": text, "GTM-EVIL": hostile])
        let b = try TestBackend()
        let h = try TestHost(plugins: TestHost.gtmPlugins(b, defaults: dir))
        let c = try h.client()
        _ = try c.open("GTM-BIG", timeoutMs: 2000)
        #expect(try c.value("GTM-BIG", "k1").stringValue?.hasPrefix("value-1-") == true)
        #expect(try c.value("GTM-BIG", "k10") == "", "unknown function id → default")
        _ = try c.open("GTM-EVIL", timeoutMs: 2000)
        // Each call is answered (within the client's timeout): nothing hangs on the evil rules.
        #expect(try c.value("GTM-EVIL", "a") == "")
        #expect(try c.value("GTM-EVIL", "bad") == "")
        #expect(try c.value("GTM-EVIL", "ok") == "", "the regex rules never pass")
        _ = try c.call("gtm.push", ["data": ["event": "x"]])
        #expect(try c.call("bus.ping")["pong"] == true)
        #expect(h.logText.contains("Macro cycle detected") || h.logText.contains("out of range"))
    }
}
