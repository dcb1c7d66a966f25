import Foundation
import PylonClientKit
import TestSupport
import Testing

/// A reload is checked by every plugin's own strict reader before anything is applied (issue 32
/// item 6): a file with a bad plugin setting is refused whole, with file:line and the plugin, and
/// the running configuration stays; the checks run beside the loop, which keeps answering.
@Suite(.serialized) struct ReloadCheckTests {
    /// The host's config with an uploader (no backend needed: it only has to start) and a limit
    /// the test changes, written one setting a line as an operator would.
    func write(_ h: TestHost, endpoint: String, maxSubscriptions: Int) throws -> String {
        let cfg: JSON = [
            "socket": .string(h.socket), "stateDir": .string(h.stateDir), "pluginDir": .string(binDir), "logLevel": "debug",
            "limits": ["maxSubscriptionsPerConnection": .int(Int64(maxSubscriptions))],
            "plugins": [
                [
                    "name": "uploader", "exec": "pylon-uploader", "backoffInitialMs": 50,
                    "config": ["endpoint": .string(endpoint), "retryInitialMs": 100],
                ]
            ],
        ]
        let text = try Self.pretty(cfg)
        try text.write(toFile: h.configPath, atomically: true, encoding: .utf8)
        return text
    }

    static func pretty(_ j: JSON) throws -> String {
        let object = try JSONSerialization.jsonObject(with: Data(j.serialized.utf8))
        return String(decoding: try JSONSerialization.data(withJSONObject: object, options: [.prettyPrinted, .sortedKeys]), as: UTF8.self)
    }

    func pylonctl(_ h: TestHost, _ args: [String]) throws -> (status: Int32, err: String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylonctl")
        p.arguments = ["--socket", h.socket] + args
        let err = Pipe()
        p.standardError = err
        p.standardOutput = FileHandle.nullDevice
        try p.run()
        let data = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return (p.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    @Test func aBadPluginSettingRefusesTheWholeFileAndTheUploaderRunsOn() throws {
        let h = try TestHost(plugins: [])
        _ = try write(h, endpoint: "http://127.0.0.1:1/v1/batches/{stream}", maxSubscriptions: 256)
        #expect(try h.client().call("bus.reload", nil)["added"] == ["uploader"])
        try h.waitForPlugin("uploader")
        let pid = try #require(try h.plugin("uploader")["pid"]?.intValue)

        // Valid JSON, valid host settings, a limit changed, and an endpoint the uploader refuses.
        let bad = try write(h, endpoint: "gopher://127.0.0.1/{stream}", maxSubscriptions: 8)
        let line = try #require(bad.split(separator: "\n", omittingEmptySubsequences: false).firstIndex { $0.contains("\"endpoint\"") }) + 1
        let refused = try h.client().request("bus.reload")
        #expect(refused.errorCode == -32010, "\(refused)")
        let message = refused["error"]?["message"]?.stringValue ?? ""
        #expect(message.contains("\(h.configPath):\(line): plugin uploader: config: endpoint gopher://"), "\(message)")
        #expect(refused["error"]?["data"]?["plugin"] == "uploader", "\(refused)")
        // Nothing of the file was applied: the limit, the uploader's process.
        #expect(try h.status()["limits"]?["maxSubscriptionsPerConnection"] == 256)
        let uploader = try h.plugin("uploader")
        #expect(uploader["state"] == "running" && uploader["pid"]?.intValue == pid && uploader["restarts"] == 0, "\(uploader)")
        #expect(try h.client().call("uploader.status")["streams"] != nil, "the uploader still answers")
        // pylonctl reload (systemd's ExecReload) fails with EX_CONFIG and says where.
        let ctl = try pylonctl(h, ["reload"])
        #expect(ctl.status == 78, "\(ctl)")
        #expect(ctl.err.contains("\(h.configPath):\(line): plugin uploader"), "\(ctl.err)")
        // SIGHUP is refused the same way.
        kill(h.pid, SIGHUP)
        try waitUntil(timeout: 10) { h.logText.components(separatedBy: "reload failed; keeping the running configuration").count > 3 }
        #expect(try h.plugin("uploader")["pid"]?.intValue == pid)

        // A good file applies: the limit, and the uploader restarted with its new endpoint.
        _ = try write(h, endpoint: "http://127.0.0.1:2/v1/batches/{stream}", maxSubscriptions: 8)
        let ok = try h.client().call("bus.reload", nil)
        #expect(ok["restarted"] == ["uploader"], "\(ok)")
        #expect(try h.status()["limits"]?["maxSubscriptionsPerConnection"] == 8)
        try waitUntil(timeout: 10) {
            let p = try h.plugin("uploader")
            return p["state"] == "running" && p["pid"]?.intValue != pid
        }
    }

    /// Configures an echo plugin whose `--check-config` writes its pid to `started`, waits for
    /// the test's go-ahead (a line written into the FIFO `gate`), then accepts.
    func configureSlowCheck(_ h: TestHost, started: String, gate: String) throws {
        let script = h.dir + "/slow-check.sh"
        guard mkfifo(gate, 0o600) == 0 else { throw TestFailure(description: "mkfifo \(gate): errno \(errno)") }
        try """
        #!/bin/sh
        if [ "$1" = "--check-config" ]; then
            echo $$ > "\(started).tmp" && mv "\(started).tmp" "\(started)"
            read _ < "\(gate)"
            echo "config ok"; exit 0
        fi
        exec "\(binDir)/pylon-echo" "$@"
        """.write(toFile: script, atomically: true, encoding: .utf8)
        chmod(script, 0o755)
        var cfg = try JSON.parse(String(contentsOfFile: h.configPath, encoding: .utf8)).objectValue!
        cfg["plugins"] = [TestHost.echo(["exec": .string(script)])]
        try JSON.object(cfg).serialized.write(toFile: h.configPath, atomically: true, encoding: .utf8)
    }

    /// The plugins' checks run beside the loop: while one has not answered, other clients are
    /// served, and the reload is answered once it has.
    @Test func theHostAnswersWhileAPluginChecksItsConfig() throws {
        let h = try TestHost(plugins: [])
        let gate = h.dir + "/go"
        let started = h.dir + "/checking"
        try configureSlowCheck(h, started: started, gate: gate)

        let reloader = try h.client()
        try reloader.sendLine(#"{"jsonrpc":"2.0","id":1,"method":"bus.reload"}"#)
        try waitUntil(timeout: 10) { FileManager.default.fileExists(atPath: started) }
        // The check is running and cannot end before the gate opens: the host answers others
        // meanwhile, and the reload is still in flight.
        #expect(try h.client().call("bus.ping", nil, timeoutMs: 2000)["pong"] == true)
        let clients = try h.status()["clients"]?.arrayValue ?? []
        #expect(clients.contains { $0["inflight"] == 1 }, "the reload is answered only after the check: \(clients)")
        // The go-ahead: opening the FIFO meets the check's read (the check has started), one line ends it.
        let fd = open(gate, O_WRONLY)
        #expect(fd >= 0 && Glibc.write(fd, "\n", 1) == 1, "errno \(errno)")
        close(fd)
        let answer = try #require(try reloader.readMessage(timeoutMs: 10_000))
        #expect(answer["result"]?["added"] == ["echo"], "\(answer)")
        try h.waitForPlugin("echo")
    }

    /// A stop while a check runs: the check is killed, the reload is not applied, pylond exits 0.
    @Test func aStopWhileAPluginChecksKillsTheCheck() throws {
        let h = try TestHost(plugins: [])
        let started = h.dir + "/checking"
        try configureSlowCheck(h, started: started, gate: h.dir + "/never")
        let reloader = try h.client()
        try reloader.sendLine(#"{"jsonrpc":"2.0","id":1,"method":"bus.reload"}"#)
        try waitUntil(timeout: 10) { FileManager.default.fileExists(atPath: started) }
        let check = try #require(
            Int32(try String(contentsOfFile: started, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)))
        #expect(h.stop() == 0)
        try waitUntil(timeout: 5) { !isAlive(check) }
        #expect(!h.logText.contains("plugin spawned"), "the reload was not applied")
    }
}
