import Foundation
import PylonClientKit
import TestSupport
import Testing

/// `pylond --check-config` runs each enabled plugin's own strict reader of its `config`
/// (`PLUGIN --check-config`): an invalid plugin setting is refused with the plugin's name and the
/// setting's path, before a start that would fail with exit 78.
@Suite(.serialized) struct ConfigCheckTests {
    func check(_ plugins: [JSON]) throws -> (status: Int32, output: String) {
        let dir = NSTemporaryDirectory() + "pylon-check-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let cfg: JSON = [
            "socket": .string(dir + "/s.sock"), "stateDir": .string(dir), "pluginDir": .string(binDir), "plugins": .array(plugins),
        ]
        try cfg.serialized.write(toFile: dir + "/c.json", atomically: true, encoding: .utf8)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylond")
        p.arguments = ["--check-config", dir + "/c.json"]
        let out = Pipe()
        p.standardError = out
        p.standardOutput = out
        try p.run()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        return (p.terminationStatus, text)
    }

    @Test func invalidPluginSettingsAreRefusedWithThePluginAndThePath() throws {
        let r = try check([
            ["name": "uploader", "exec": "pylon-uploader", "config": ["endpoint": "ftp://backend/{stream}"]],
            ["name": "ma", "exec": "pylon-ma", "config": ["retryMaxMs": "lots", "typo": 1]],
            ["name": "gtm", "exec": "pylon-gtm", "config": ["logLevel": "loud"]],
            ["name": "push", "exec": "pylon-push", "config": ["inboxMaxCount": 0, "broker": ["brokers": ["nohostport"]]]],
        ])
        #expect(r.status == 78, "\(r.output)")
        #expect(r.output.contains("plugin uploader: config: endpoint ftp://backend/{stream}: scheme ftp is not allowed"), "\(r.output)")
        #expect(r.output.contains("c.json:1: plugin uploader: config: endpoint"), "each problem at its line: \(r.output)")
        #expect(r.output.contains("plugin ma: config.retryMaxMs: must be an integer from 0 to 86400000"), "\(r.output)")
        #expect(r.output.contains("plugin gtm: config.logLevel: must be one of"), "\(r.output)")
        #expect(r.output.contains("plugin ma: config.typo: unknown setting") && !r.output.contains("warning: plugin ma"), "\(r.output)")
        #expect(r.output.contains("plugin push: config.inboxMaxCount: must be an integer from 1 to 1000000"), "\(r.output)")
        #expect(r.output.contains("plugin push: config.broker: brokers: \"nohostport\" is not HOST:PORT"), "\(r.output)")
        #expect(!r.output.contains("configuration ok"))
    }

    @Test func anInvalidSizeIsRefused() throws {
        let r = try check([["name": "uploader", "exec": "pylon-uploader", "config": ["maxDiskBytes": "lots"]]])
        #expect(r.status == 78)
        #expect(r.output.contains("plugin uploader: config: maxDiskBytes must be an integer"), "\(r.output)")
    }

    @Test func validSettingsPass() throws {
        let r = try check([
            ["name": "uploader", "exec": "pylon-uploader", "config": ["endpoint": "http://127.0.0.1:1/v1/batches/{stream}"]],
            ["name": "ma", "exec": "pylon-ma", "config": ["backend": "http://127.0.0.1:1", "retryMaxMs": 1000]],
            ["name": "gtm", "exec": "pylon-gtm", "config": ["logLevel": "info"]],
            ["name": "push", "exec": "pylon-push", "config": ["broker": ["host": "127.0.0.1", "port": 1883]]],
            // A plugin without a checker (the echo test plugin) is named, not failed.
            ["name": "echo", "exec": "pylon-echo"],
        ])
        #expect(r.status == 0, "\(r.output)")
        #expect(r.output.contains("configuration ok: 5 plugins"), "\(r.output)")
        #expect(r.output.contains("warning: plugin echo: pylon-echo has no configuration checker"), "\(r.output)")
    }

    @Test func aPluginAsksOnlyForItsCheckWithoutABus() throws {
        // `PLUGIN --check-config` is answered without PYLON_BUS_FD: a person can run it too.
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylon-ma")
        p.arguments = ["--check-config"]
        let input = Pipe(), out = Pipe()
        p.standardInput = input
        p.standardOutput = out
        p.standardError = out
        try p.run()
        input.fileHandleForWriting.write(Data(#"{"maxAppKeys": -1}"#.utf8))
        try input.fileHandleForWriting.close()
        let text = String(decoding: out.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        #expect(p.terminationStatus == 78)
        #expect(text.contains("config.maxAppKeys: must be an integer from 1 to"), "\(text)")
    }
}
