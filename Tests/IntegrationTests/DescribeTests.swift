import Foundation
import PylonClientKit
import PylonProtocol
import TestSupport
import Testing

/// `bus.describe` through the real host: every built-in plugin's methods and every host method
/// carry docs; the OpenRPC form and its disclosure rule; the host's param check; plugins that
/// send no docs, or bad ones.
@Suite(.serialized) struct DescribeTests {
    /// All five built-in plugins against one backend and broker.
    static func allPlugins(_ world: PushWorld) throws -> [JSON] {
        let fast: JSON = ["maxCount": 50, "intervalMs": 600000]
        return [
            TestHost.uploader(world.backend, config: ["streams": ["ma.*": fast, "gtm.*": fast, "push.*": fast]]),
            TestHost.maPlugins(world.backend)[1],
            TestHost.gtmPlugins(world.backend, defaults: try defaultsDir([:]))[1],
            world.plugins()[1],
            TestHost.echo(),
        ]
    }

    static func waitForAll(_ h: TestHost) throws {
        for p in ["uploader", "ma", "gtm", "push", "echo"] { try h.waitForPlugin(p, timeout: 20) }
    }

    /// Fails when a method a built-in plugin registers (or a host method) has no doc: a summary
    /// and a result, each param with a name, a JSON type and `required`.
    @Test func everyRoutedMethodIsDocumented() throws {
        let world = try PushWorld()
        let h = try TestHost(plugins: try Self.allPlugins(world))
        try Self.waitForAll(h)
        let d = try h.client().call("bus.describe")
        var undocumented: [String] = []
        var count = 0
        let entries = (d["hostMethods"]?.arrayValue ?? []) + ["uploader", "ma", "gtm", "push", "echo"].flatMap {
            d["plugins"]?[$0]?["methods"]?.arrayValue ?? []
        }
        for m in entries {
            count += 1
            let name = m["name"]?.stringValue ?? "?"
            guard let o = m.objectValue, let doc = try? MethodDoc.parse(o), !doc.summary.isEmpty else {
                undocumented.append(name)
                continue
            }
            #expect(o["result"]?["type"]?.stringValue != nil, "\(name)")
        }
        #expect(undocumented.isEmpty, "methods without a doc: \(undocumented)")
        #expect(d["hostMethods"]?.arrayValue?.count == HostMethod.served.count)
        #expect(count > 60, "all the plugins' methods were listed: \(count)")
        // One declared doc as sent: ma.eventRecord's required eventName.
        let ev = d["plugins"]?["ma"]?["methods"]?.arrayValue?.first { $0["name"] == "ma.eventRecord" }
        #expect(ev?["params"]?.arrayValue?.contains { $0["name"] == "eventName" && $0["required"] == true && $0["type"] == "string" } == true)
        #expect(ev?["consent"] == "ma:{appKey}", "the consent template is still there")
    }

    /// `{"format":"openrpc"}`: an OpenRPC 1.2.6 document listing the same methods; a non-admin
    /// sees its own provided methods and not another user's, as in the Pylon form.
    @Test func openRPCFormAndItsDisclosure() throws {
        let h = try TestHost.open(plugins: [TestHost.echo()])
        let root = try h.client()
        _ = try root.call("bus.provide", ["method": "rootsvc.secret"])
        let doc = try root.call("bus.describe", ["format": "openrpc"])
        #expect(doc["openrpc"] == "1.2.6")
        #expect(doc["info"]?["title"]?.stringValue?.isEmpty == false && doc["info"]?["version"]?.stringValue != nil)
        let methods = doc["methods"]?.arrayValue ?? []
        for m in methods {
            #expect(m["name"]?.stringValue != nil && m["params"]?.arrayValue != nil, "\(m.serialized)")
            #expect(m["result"]?["name"]?.stringValue != nil && m["result"]?["schema"]?.objectValue != nil, "\(m.serialized)")
            for p in m["params"]?.arrayValue ?? [] {
                #expect(p["name"]?.stringValue != nil && p["required"]?.boolValue != nil && p["schema"]?.objectValue != nil)
            }
        }
        let names = Set(methods.compactMap { $0["name"]?.stringValue })
        let pylon = try root.call("bus.describe")
        let expected = Set(
            HostMethod.served + (pylon["plugins"]?["echo"]?["methods"]?.arrayValue ?? []).compactMap { $0["name"]?.stringValue }
                + ["rootsvc.secret"])
        #expect(names == expected)
        let sleep = methods.first { $0["name"] == "echo.sleep" }
        #expect(sleep?["summary"]?.stringValue?.isEmpty == false)
        #expect(sleep?["params"]?.arrayValue?.first?["schema"]?["type"] == "integer")
        #expect(methods.first { $0["name"] == "echo.collect" }?["x-pylon-consent"] == "echo:{appKey}")
        #expect(methods.first { $0["name"] == "bus.ping" }?["x-pylon-plugin"] == "pylond")

        // A non-admin: its own provided method, not root's.
        let r = try h.runAs(
            sequential: true,
            [
                #"{"jsonrpc":"2.0","id":0,"method":"bus.provide","params":{"method":"mysvc.hello"}}"#,
                #"{"jsonrpc":"2.0","id":1,"method":"bus.describe","params":{"format":"openrpc"}}"#,
                #"{"jsonrpc":"2.0","id":2,"method":"bus.describe","params":{"format":"yaml"}}"#,
            ])
        let theirs = try #require(r.replies.first { $0["id"] == 1 }?["result"]?["methods"]?.arrayValue)
        let theirNames = Set(theirs.compactMap { $0["name"]?.stringValue })
        #expect(theirNames.contains("mysvc.hello") && !theirNames.contains("rootsvc.secret"), "\(theirNames.sorted())")
        #expect(theirNames.contains("echo.echo") && theirNames.contains("bus.ping"))
        #expect(r.replies.first { $0["id"] == 2 }?.errorCode == -32602, "an unknown format is refused")
    }

    /// For a method whose doc lets the host check its params (gtm.setLogLevel), a missing
    /// required param or a wrong type answers -32602 naming the param, from the host (the
    /// plugin words its own refusal differently), on either routing path; good params reach
    /// the plugin.
    @Test func hostChecksDeclaredParams() throws {
        let world = try PushWorld()
        let h = try TestHost(plugins: [TestHost.gtmPlugins(world.backend, defaults: try defaultsDir([:]))[1]])
        try h.waitForPlugin("gtm")
        let c = try h.client()
        func expectRefused(_ params: JSON?, _ param: String, _ text: String) {
            do {
                _ = try c.call("gtm.setLogLevel", params)
                Issue.record("\(params?.serialized ?? "nil"): not refused")
            } catch let e as RPCError {
                #expect(e.code == -32602 && e.message.hasPrefix("gtm.setLogLevel: ") && e.message.contains(text), "\(e.message)")
                #expect(e.data?["param"] == .string(param))
            } catch {
                Issue.record("\(error)")
            }
        }
        expectRefused(nil, "level", "params.level (string) is required")
        expectRefused([:], "level", "is required")
        expectRefused(["level": 5], "level", "must be of type string, not integer")
        expectRefused(["level": "info", "uid": "0"], "uid", "must be of type integer, not string")
        // The full path (an escaped key makes the fast scan unsure) checks the same.
        let slow = try c.roundTrip(#"{"jsonrpc":"2.0","id":9,"method":"gtm.setLogLevel","params":{"lev\u0065l":7}}"#)
        #expect(slow.errorCode == -32602 && slow["error"]?["data"]?["param"] == "level", "\(slow.serialized)")
        // Good params reach the plugin, which judges their values itself.
        #expect(try c.call("gtm.setLogLevel", ["level": "debug"])["level"] == "debug")
        do {
            _ = try c.call("gtm.setLogLevel", ["level": "loud"])
            Issue.record("the plugin accepted level loud")
        } catch let e as RPCError {
            #expect(e.code == -32602 && !e.message.hasPrefix("gtm.setLogLevel: "), "the plugin's own refusal: \(e.message)")
        }
        // A method that does not opt in is left to its plugin: gtm.preview answers {preview: false}.
        #expect(try c.call("gtm.preview", [:])["preview"] == false)
    }

    /// A plugin that sends no docs still runs and is listed without them; one whose docs are
    /// malformed is refused at bus.hello with the fault named in the host's log.
    @Test func pluginsWithoutDocsOrWithBadDocs() throws {
        let h = try TestHost(plugins: [
            ["name": "py", "exec": .string(fixturesDir + "/fake_echo.py")],
            [
                "name": "bad", "exec": .string(fixturesDir + "/fake_echo.py"), "restart": "temporary",
                "env": ["PYLON_FAKE_BAD_DOC": "1"],
            ],
        ])
        try h.waitForPlugin("py")
        let c = try h.client()
        #expect(try c.call("py.echo", ["a": 1]) == ["a": 1])
        let methods = try c.call("bus.describe")["plugins"]?["py"]?["methods"]?.arrayValue ?? []
        #expect(methods.map { $0["name"] } == ["py.echo", "py.whoami", "py.slowecho"])
        #expect(methods.allSatisfy { $0["summary"] == nil && $0["params"] == nil })
        try waitUntil(timeout: 10) { h.logText.contains("plugin handshake rejected") }
        #expect(h.logText.contains("bus.hello: manifest.methods bad: params[0] (x): type must be one of"), "\(h.logText.suffix(3000))")
        #expect(try h.plugin("bad")["state"] != "running")
    }
}
