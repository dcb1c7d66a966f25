import Foundation
import PylonCore
import PylonProtocol
import Testing

@testable import PylonHost

struct ConsentStoreTests {
    @Test func neverSetIsGranted() {
        #expect(ConsentStore().isGranted("ma:abc"))
    }

    @Test func denyAndGrantChangeTheEpoch() {
        var s = ConsentStore()
        let first = s.set("ma:a", granted: false)
        #expect(first)
        #expect(!s.isGranted("ma:a"))
        #expect(s.epoch == 1)
        let again = s.set("ma:a", granted: false)
        #expect(!again, "setting the same value is not a change")
        let back = s.set("ma:a", granted: true)
        #expect(back)
        #expect(s.epoch == 2)
    }

    @Test func masterSwitchOverridesEverything() {
        var s = ConsentStore()
        s.set("ma:a", granted: true)
        s.set(ConsentStore.master, granted: false)
        #expect(!s.isGranted("ma:a"))
        #expect(!s.isGranted("anything"))
    }

    @Test func snapshotRoundTrips() throws {
        var s = ConsentStore()
        s.set("x", granted: false)
        s.set("y", granted: true)
        s.set("ma:z", granted: false, layer: .app)
        #expect(try ConsentStore.restore(s.snapshot).get() == s)
        #expect(throws: ConsentStore.RestoreError.self) { try ConsentStore.restore(["switches": ["x": "yes"]]).get() }
        #expect(throws: ConsentStore.RestoreError.self) { try ConsentStore.restore(["nothing": 1]).get() }
    }

    /// A damaged consent file fails closed instead of being read as something it is not.
    @Test func restoreRefusesBadEpochsKeysAndLayers() {
        for bad: JSON in [
            ["epoch": "x", "switches": [:]], ["epoch": -5, "switches": [:]], ["epoch": 1.5, "switches": [:]],
            ["switches": ["has space": true]], ["switches": [:], "app": ["device": false]], ["switches": [:], "app": 3],
        ] {
            #expect(throws: ConsentStore.RestoreError.self, "\(bad)") { try ConsentStore.restore(bad).get() }
        }
    }

    /// A consent file that is not exactly what the host writes fails closed (master denied): a
    /// bad epoch, a duplicated switch, an app layer for the master switch, an epoch at Int64's end
    /// (the next change trapped the host, at every start), text that is not JSON. The host lives
    /// on: a change to the failed-closed switches works (was SecurityTests, five pylond runs).
    @Test func aDamagedConsentFileFailsClosed() throws {
        let bad = [
            #"{"epoch":"x","switches":{}}"#, #"{"epoch":-5,"switches":{}}"#,
            #"{"epoch":1,"switches":{"ma:a":false,"ma:a":true}}"#, #"{"epoch":1,"switches":{},"app":{"device":true}}"#,
            #"{"epoch":9223372036854775807,"switches":{},"app":{}}"#, #"{"epoch":1,"switches":{}"#,
        ]
        for text in bad {
            guard case .failure(let e) = ConsentStore.read(fileBytes: Array(text.utf8)) else {
                Issue.record("read: \(text)")
                continue
            }
            #expect(!e.reason.isEmpty)
        }
        guard case .failure(let dup) = ConsentStore.read(fileBytes: Array(bad[2].utf8)) else { return }
        #expect(dup.reason == "damaged (key ma:a appears twice)")
        var closed = ConsentStore.failedClosed
        #expect(!closed.masterGranted && !closed.isGranted("ma:x"))
        let changed = closed.set("ma:x", granted: false)
        #expect(changed && closed.epoch == 2, "the host lives on: the next change is an ordinary one")
        var s = ConsentStore()
        s.set("ma:k", granted: false)
        #expect(try ConsentStore.read(fileBytes: Array(s.snapshot.serialized.utf8)).get() == s, "what the host writes reads back")
    }

    /// An app can narrow a switch but never re-grant what the operator denied.
    @Test func appLayerOnlyNarrows() {
        var s = ConsentStore()
        let denied = s.set("ma:v", granted: false)  // operator denies
        let appGrant = s.set("ma:v", granted: true, layer: .app)  // the app's grant changes nothing
        #expect(denied && !appGrant)
        #expect(!s.isGranted("ma:v"))
        let regrant = s.set("ma:v", granted: true)  // operator grants again
        #expect(regrant && s.isGranted("ma:v"))
        let narrowed = s.set("ma:v", granted: false, layer: .app)  // the app narrows
        #expect(narrowed && !s.isGranted("ma:v"))
        #expect(s.effective["ma:v"] == false)
        #expect(s.explicitValue("ma:v") == true && s.appValue("ma:v") == false)
    }

    @Test func keyValidation() {
        #expect(ConsentStore.validate(key: "ma:abc") == nil)
        #expect(ConsentStore.validate(key: "") != nil)
        #expect(ConsentStore.validate(key: "has space") != nil)
        #expect(ConsentStore.validate(key: String(repeating: "k", count: 300)) != nil)
    }
}

struct ManifestTests {
    @Test func consentTemplateResolvesFromParams() throws {
        let m = try Manifest.parse([
            "name": "ma", "protocol": 1,
            "manifest": ["methods": [["name": "eventRecord", "consent": "ma:{appKey}", "onDenied": "drop"], "start"]],
        ])
        let spec = try #require(m.methods["ma.eventRecord"])
        #expect(spec.dropWhenDenied)
        #expect(spec.consentKey(params: ["appKey": "K1"]) == .key("ma:K1"))
        #expect(spec.consentKey(params: ["other": 1]) == .unresolved)
        #expect(m.methods["ma.start"]?.consentKey(params: nil) == ConsentKey.none)
    }

    @Test func unsupportedProtocolIsRefused() {
        #expect(throws: RPCError.self) { try Manifest.parse(["name": "x", "protocol": 99]) }
    }
}

struct ConfigTests {
    @Test func parsesPluginsAndLimits() throws {
        let c = try HostConfig.parse([
            "socket": "/tmp/x.sock", "socketMode": "0600",
            "limits": ["maxLineBytes": 4096, "maxInflightPerConnection": 8, "flushAboveBytes": 0],
            "plugins": [["name": "echo", "exec": "pylon-echo", "restart": "transient", "maxRestarts": 2, "config": ["a": 1]]],
        ])
        #expect(c.limits.flushAboveBytes == 0)
        #expect(try HostConfig.parse([:]).limits.flushAboveBytes == 4096)
        #expect(c.socketPath == "/tmp/x.sock")
        #expect(c.socketMode == 0o600)
        #expect(c.limits.maxLineBytes == 4096)
        #expect(c.limits.maxInflightPerConnection == 8)
        #expect(c.plugins.first?.policy.restart == .transient)
        #expect(c.plugins.first?.policy.maxRestarts == 2)
        #expect(c.plugins.first?.config == ["a": 1])
    }

    @Test func unknownKeysAreErrors() {
        #expect(throws: ConfigError.self) { try HostConfig.parse(["sockett": "/x"]) }
        #expect(throws: ConfigError.self) { try HostConfig.parse(["limits": ["maxLines": 1]]) }
    }

    /// A configuration with a key given twice is refused with the key named (json-c would keep
    /// the last silently; was SecurityTests, through `pylond --check-config`).
    @Test func aConfigWithADuplicateKeyIsRefused() throws {
        let path = NSTemporaryDirectory() + "pylon-dup-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).json"
        try #"{"socket":"/tmp/s.sock","logLevel":"info","logLevel":"debug","plugins":[]}"#
            .write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        do {
            _ = try HostConfig.load(path: path, environment: { _ in nil })
            Issue.record("a key given twice was accepted")
        } catch {
            #expect(error.description == "\(path): key \"logLevel\" appears twice in one object")
        }
    }

    @Test func wrongTypesAreErrors() {
        #expect(throws: ConfigError.self) { try HostConfig.parse(["limits": ["maxLineBytes": "big"]]) }
        #expect(throws: ConfigError.self) { try HostConfig.parse(["limits": ["flushAboveBytes": -1]]) }
        #expect(throws: ConfigError.self) { try HostConfig.parse(["plugins": [["name": "x", "exec": "y", "restart": "sometimes"]]]) }
        #expect(throws: ConfigError.self) { try HostConfig.parse(["plugins": [["name": "bus", "exec": "y"]]]) }
    }

    @Test func duplicatePluginNamesAreErrors() {
        #expect(throws: ConfigError.self) {
            try HostConfig.parse(["plugins": [["name": "a", "exec": "x"], ["name": "a", "exec": "y"]]])
        }
    }

    @Test func permissionRuleDecides() throws {
        let c = try HostConfig.parse(["permissions": [["method": "consent.set", "uids": [0]]]])
        let rule = try #require(c.permissions.first)
        #expect(rule.method.matches("consent.set"))
        #expect(rule.allowed.allows(PeerCredentials(pid: 1, uid: 0, gid: 0)))
        #expect(!rule.allowed.allows(PeerCredentials(pid: 1, uid: 1000, gid: 1000)))
    }

    @Test func scanIdFindsTheIdOfAnOversizedLine() {
        #expect(Bus.scanId(Array(#"{"jsonrpc":"2.0","id":42,"method":"x","params":"#.utf8)) == .int(42))
        #expect(Bus.scanId(Array(#"{"id": "abc","#.utf8)) == .string("abc"))
        #expect(Bus.scanId(Array(#"{"method":"x","params":{"#.utf8)) == nil)
    }
}
