import Foundation
import PylonClientKit
import TestSupport
import Testing

/// Real processes: crashes, hangs, shutdown, and swapping an implementation by configuration.
@Suite(.serialized) struct SupervisionTests {
    @Test func killDashNineUnderLoadFailsInflightPromptlyAndRestarts() throws {
        let h = try TestHost()
        let pid = try #require(try h.plugin()["pid"]?.intValue)
        let c = try h.client()
        for i in 0..<40 { try c.sendLine(#"{"jsonrpc":"2.0","id":\#(i),"method":"echo.sleep","params":{"ms":5000}}"#) }
        // All 40 are forwarded to the plugin (the host's in-flight count for it).
        try waitUntil(timeout: 10) { try h.plugin()["inflight"] == .int(40) }
        kill(Int32(pid), SIGKILL)
        for _ in 0..<40 {
            let m = try #require(try c.readMessage(timeoutMs: 10_000))
            // -32001 comes from the exit; the 30 s request timeout would answer -32002.
            #expect(m.errorCode == -32001, "in-flight requests of a dead plugin get 'plugin unavailable', not a timeout")
        }
        try h.waitForPlugin(restartsAtLeast: 1)
        #expect(try c.call("echo.echo", ["back": true]) == ["back": true])
        let p = try h.plugin()
        #expect(p["pid"]?.intValue != pid)
        #expect(h.logText.contains("killed by signal 9"))
    }

    @Test func hungPluginIsDetectedKilledAndRestarted() throws {
        let h = try TestHost(plugins: [TestHost.echo(name: "echo", ["heartbeatIntervalMs": 100, "heartbeatTimeoutMs": 400])])
        let pid = try #require(try h.plugin()["pid"]?.intValue)
        let c = try h.client()
        _ = try c.call("echo.hang")
        try h.waitForPlugin(restartsAtLeast: 1, timeout: 10)
        #expect(!isAlive(Int32(pid)), "the hung process was killed")
        #expect(try c.call("echo.echo", [1]) == [1])
        #expect(h.logText.contains("heartbeat"))
    }

    @Test func crashLoopEndsInFailedNotATightLoop() throws {
        let h = try TestHost(plugins: [TestHost.echo(name: "echo", ["maxRestarts": 2, "intensityWindowMs": 60000, "backoffInitialMs": 10])])
        for i in 0..<3 {
            // The copy started after crash i-1 (a loaded machine may still report the old one
            // as running for a moment, and a crash sent to it would be lost).
            try h.waitForPlugin(restartsAtLeast: i)
            _ = try? h.client().call("echo.crash", JSON?.none, timeoutMs: 2000)
        }
        try h.waitForPlugin(state: "failed")
        let p = try h.plugin()
        #expect(p["failed_reason"]?.stringValue?.contains("intensity") == true)
        let r = try h.client().roundTrip(#"{"jsonrpc":"2.0","id":1,"method":"echo.echo","params":[]}"#)
        #expect(r.errorCode == -32001)
        #expect(r["error"]?["data"]?["state"] == JSON.string("failed"))
        // A manual restart brings it back.
        _ = try h.client().call("bus.restart", ["plugin": "echo"])
        try h.waitForPlugin()
    }

    @Test func sigtermStopsHostAndEveryPlugin() throws {
        let h = try TestHost(plugins: [TestHost.echo(), ["name": "py", "exec": .string(fixturesDir + "/fake_echo.py")]])
        let pids = try h.status()["plugins"]!.arrayValue!.compactMap { $0["pid"]?.intValue }
        #expect(pids.count == 2)
        let status = h.stop()
        #expect(status == 0)
        for p in pids { #expect(!isAlive(Int32(p)), "plugin \(p) outlived the host") }
        #expect(!FileManager.default.fileExists(atPath: h.socket), "socket removed on stop")
    }

    @Test func pluginsExitWhenTheHostIsKilled() throws {
        let h = try TestHost()
        let pid = try #require(try h.plugin()["pid"]?.intValue)
        h.kill9()
        try waitUntil(timeout: 5) { !isAlive(Int32(pid)) }
    }

    @Test func pythonPluginSwappedInByConfigurationServesCalls() throws {
        let h = try TestHost(plugins: [["name": "echo", "exec": .string(fixturesDir + "/fake_echo.py")]])
        let c = try h.client()
        #expect(try c.call("echo.echo", ["from": "python?"]) == ["from": "python?"])
        #expect(try c.call("echo.whoami")["implementation"] == .string("python"))
        #expect(try h.plugin()["version"] == .string("python-1.0"))
    }

    @Test func pluginStderrLandsInTheHostLog() throws {
        let h = try TestHost(plugins: [
            [
                "name": "sh", "exec": "/bin/sh",
                "args": ["-c", "echo 'hello from stderr' >&2; exec sleep 30"],
                "startTimeoutMs": 500, "backoffInitialMs": 5000,
            ]
        ])
        try waitUntil(timeout: 5) { h.logText.contains("hello from stderr") }
        #expect(h.logText.contains("plugin=sh"))
        // It never handshakes, so it is killed at the start deadline and scheduled for restart.
        try waitUntil(timeout: 5) { h.logText.contains("no handshake") }
    }

    @Test func sighupReloadAddsAPlugin() throws {
        let h = try TestHost()
        var cfg = try JSON.parse(String(contentsOfFile: h.configPath, encoding: .utf8)).objectValue!
        cfg["plugins"] = [TestHost.echo(), ["name": "py", "exec": .string(fixturesDir + "/fake_echo.py")]]
        try JSON.object(cfg).serialized.write(toFile: h.configPath, atomically: true, encoding: .utf8)
        kill(h.pid, SIGHUP)
        try h.waitForPlugin("py")
        #expect(try h.client().call("py.whoami")["implementation"] == .string("python"))
    }

    @Test func sighupReloadOfAChangedPluginStartsTheNewCopyOnlyAfterTheOldExited() throws {
        let h = try TestHost()
        let oldPid = try #require(try h.plugin()["pid"]?.intValue)
        var cfg = try JSON.parse(String(contentsOfFile: h.configPath, encoding: .utf8)).objectValue!
        cfg["plugins"] = [TestHost.echo(name: "echo", ["config": ["generation": 2]])]
        try JSON.object(cfg).serialized.write(toFile: h.configPath, atomically: true, encoding: .utf8)
        kill(h.pid, SIGHUP)
        try waitUntil(timeout: 10) {
            let p = try h.plugin()
            return p["state"] == .string("running") && p["pid"]?.intValue != oldPid
        }
        let newPid = try #require(try h.plugin()["pid"]?.intValue)
        let lines = h.logText.split(separator: "\n")
        let exited = try #require(lines.firstIndex { $0.contains("msg=\"plugin exited\"") && $0.contains("pid=\(oldPid)") })
        let spawned = try #require(lines.firstIndex { $0.contains("msg=\"plugin spawned\"") && $0.contains("pid=\(newPid)") })
        #expect(exited < spawned, "two copies must never run on the same state directory")
        #expect(try h.client().call("echo.echo", ["x": 1]) == ["x": 1])
    }
}

/// Stopping escalates the usual way: bus.shutdown and EOF, then SIGTERM after the grace period,
/// then SIGKILL only if SIGTERM did not work.
@Suite(.serialized) struct StopEscalationTests {
    @Test func aPluginIgnoringShutdownGetsSIGTERMBeforeSIGKILL() throws {
        let h = try TestHost(plugins: [
            [
                "name": "py", "exec": .string(fixturesDir + "/fake_echo.py"), "stopGraceMs": 300,
                "env": ["FAKE_IGNORE_STOP": "1"],
            ]
        ])
        try h.waitForPlugin("py")
        let status = h.stop()
        #expect(status == 0, "pylond stopped cleanly")
        let log = h.logText
        #expect(log.contains("sending SIGTERM"), "\(log.suffix(800))")
        #expect(!log.contains("ignored SIGTERM"), "the default SIGTERM action stopped it; no SIGKILL needed")
    }
}

/// Reloads that retire a plugin while it is still running, a late line from its child, and the
/// host's shutdown around them.
@Suite(.serialized) struct RetiredPluginTests {
    static func stubborn(_ extra: JSONObject = [:], grace: Int64 = 3000) -> JSON {
        var o: JSONObject = [
            "name": "py", "exec": .string(fixturesDir + "/fake_echo.py"), "stopGraceMs": .int(grace),
            "env": ["FAKE_IGNORE_STOP": "1"],
        ]
        for (k, v) in extra { o[k] = v }
        return .object(o)
    }

    func rewrite(_ h: TestHost, plugins: [JSON]) throws {
        var cfg = try JSON.parse(String(contentsOfFile: h.configPath, encoding: .utf8)).objectValue!
        cfg["plugins"] = .array(plugins)
        try JSON.object(cfg).serialized.write(toFile: h.configPath, atomically: true, encoding: .utf8)
    }

    /// A child of a removed plugin that writes to the inherited stderr after the plugin exited:
    /// the host relays the line (it trapped on an unowned reference to the retired slot).
    @Test func aRemovedPluginsChildWritingLateDoesNotCrashTheHost() throws {
        let h = try TestHost(plugins: [
            [
                "name": "py", "exec": "/bin/sh",
                "args": .array(["-c", .string("(sleep 1.5; echo 'late line' >&2) & exec " + fixturesDir + "/fake_echo.py")]),
            ]
        ])
        try h.waitForPlugin("py")
        try rewrite(h, plugins: [])
        kill(h.pid, SIGHUP)
        try waitUntil(timeout: 10) { h.logText.contains("late line") }
        #expect(try h.client().call("bus.ping")["pong"] == .bool(true))
    }

    /// SIGTERM waits for a plugin a reload is still stopping: it never outlives the host.
    @Test func shutdownWaitsForAPluginAReloadIsStopping() throws {
        let h = try TestHost(plugins: [Self.stubborn()])
        try h.waitForPlugin("py")
        let oldPid = try #require(try h.plugin("py")["pid"]?.intValue)
        try rewrite(h, plugins: [Self.stubborn(["config": ["generation": 2]])])
        kill(h.pid, SIGHUP)
        try waitUntil(timeout: 5) { h.logText.contains("waiting for the old copy to exit") }
        // Meanwhile the new copy waits: a manual restart must not start it beside the old one.
        #expect(try h.client().request("bus.restart", ["plugin": "py"]).errorCode == -32001)
        #expect(h.stop() == 0)
        #expect(kill(Int32(oldPid), 0) != 0, "the old copy was stopped before the host exited")
    }

    /// Removed and added again (or changed twice) while the old copy is still stopping: the new
    /// one starts only after the old one exited, never beside it.
    @Test func aPluginAddedBackWhileItsOldCopyStopsWaitsForIt() throws {
        let h = try TestHost(plugins: [Self.stubborn(grace: 1500)])
        try h.waitForPlugin("py")
        let oldPid = try #require(try h.plugin("py")["pid"]?.intValue)
        try rewrite(h, plugins: [])
        kill(h.pid, SIGHUP)
        try waitUntil(timeout: 5) { h.logText.contains("reload: plugin removed") }
        try rewrite(h, plugins: [Self.stubborn(grace: 1500)])
        kill(h.pid, SIGHUP)
        try waitUntil(timeout: 15) {
            let p = try h.plugin("py")
            return p["state"] == .string("running") && p["pid"]?.intValue != oldPid
        }
        let newPid = try #require(try h.plugin("py")["pid"]?.intValue)
        let lines = h.logText.split(separator: "\n")
        let exited = try #require(lines.firstIndex { $0.contains("msg=\"plugin exited\"") && $0.contains("pid=\(oldPid)") })
        let spawned = try #require(lines.firstIndex { $0.contains("msg=\"plugin spawned\"") && $0.contains("pid=\(newPid)") })
        #expect(exited < spawned, "two copies must never run on the same state directory")
    }

    /// A reload that arrives while the host is stopping starts nothing, and the host exits.
    @Test func aReloadWhileStoppingIsIgnored() throws {
        let h = try TestHost(plugins: [Self.stubborn(grace: 1500)])
        try h.waitForPlugin("py")
        try rewrite(h, plugins: [Self.stubborn(grace: 1500), TestHost.echo()])
        kill(h.pid, SIGTERM)
        try waitUntil(timeout: 10) { h.logText.contains("shutting down") }  // the host is stopping
        kill(h.pid, SIGHUP)
        #expect(h.stop() == 0, "pylond exits (it waited forever for the plugin the reload started)")
        #expect(h.logText.contains("reload ignored"))
    }
}
