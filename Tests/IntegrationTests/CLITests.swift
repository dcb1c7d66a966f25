import Foundation
import PylonClientKit
import TestSupport
import Testing

/// `pylonctl` against a real host: exit statuses a script relies on.
@Suite(.serialized) struct CLITests {
    /// Runs pylonctl against `h` (as `uid`, when given, through setpriv); its exit status,
    /// standard output and standard error. `input` is its standard input.
    func ctl(_ h: TestHost, _ args: [String], input: String = "", uid: UInt32? = nil) throws -> (status: Int32, out: String, err: String) {
        let p = Process()
        if let uid {
            p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            p.arguments = ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups", binDir + "/pylonctl", "--socket", h.socket] + args
        } else {
            p.executableURL = URL(fileURLWithPath: binDir + "/pylonctl")
            p.arguments = ["--socket", h.socket] + args
        }
        let out = Pipe()
        let err = Pipe()
        let inp = Pipe()
        p.standardOutput = out
        p.standardError = err
        p.standardInput = inp
        try p.run()
        inp.fileHandleForWriting.write(Data(input.utf8))
        try inp.fileHandleForWriting.close()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        let errData = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        let status = p.terminationReason == .uncaughtSignal ? 128 + p.terminationStatus : p.terminationStatus
        return (status, String(decoding: data, as: UTF8.self), String(decoding: errData, as: UTF8.self))
    }

    /// `call METHOD -` reads the params from standard input; `--pretty` indents the result; a
    /// socket the caller may not open says which group may.
    @Test func paramsFromStdinPrettyOutputAndPermissionDenied() throws {
        let h = try TestHost(plugins: [TestHost.echo()])
        let r = try ctl(h, ["call", "echo.echo", "-"], input: #"{"from":"stdin","n":[1,2]}"#)
        #expect(r.status == 0, "\(r)")
        let fromStdin = try JSON.parse(r.out)
        #expect(fromStdin == ["from": "stdin", "n": [1, 2]])
        #expect(try ctl(h, ["call", "echo.echo", "-"], input: "{nope").status == 64)
        let p = try ctl(h, ["--pretty", "call", "echo.echo", #"{"a":{"b":1}}"#])
        #expect(p.status == 0 && p.out.contains("\n") && p.out.split(separator: "\n").count > 2, "\(p.out)")
        let indented = try JSON.parse(p.out)
        #expect(indented == ["a": ["b": 1]])
        // The test host's socket is 0660 (root's group): uid 65534 may not open it.
        let denied = try ctl(h, ["ping"], uid: 65534)
        #expect(denied.status == 69)
        #expect(denied.err.contains("permission denied") && denied.err.contains("members of group"), "\(denied.err)")
    }

    /// A reply read after the deadline is a timeout (75), not a trap: the time left was computed
    /// in unsigned arithmetic and wrapped (exit 132). Out-of-range timeouts are usage errors.
    @Test func aTinyTimeoutTimesOutAndBadTimeoutsAreUsageErrors() throws {
        let h = try TestHost()
        for _ in 0..<5 {
            let r = try ctl(h, ["--timeout", "0.001", "ping"])
            #expect(r.status == 0 || r.status == 75, "exit \(r.status)")
        }
        for bad in ["inf", "1e20", "0", "-1", "nan"] { #expect(try ctl(h, ["-t", bad, "ping"]).status == 64, "\(bad)") }
        #expect(try ctl(h, ["ping"]).status == 0)
    }

    /// `pylonctl status` tells a script what `systemctl is-failed` would: 0 all running, 3 a
    /// plugin failed (it used to exit 0), 0 again after a restart clears it.
    @Test func statusExitsThreeWithAFailedPlugin() throws {
        let h = try TestHost(plugins: [TestHost.echo(name: "echo", ["maxRestarts": 0, "intensityWindowMs": 60000])])
        try h.waitForPlugin(state: "running")
        #expect(try ctl(h, ["status"]).status == 0)
        _ = try? h.client().call("echo.crash", nil, timeoutMs: 2000)
        try h.waitForPlugin(state: "failed")
        let failed = try ctl(h, ["status"])
        #expect(failed.status == 3 && failed.out.contains("failed"), "exit \(failed.status)")
        #expect(try ctl(h, ["status", "--json"]).status == 3)
        _ = try h.client().call("bus.restart", ["plugin": "echo"])
        try h.waitForPlugin(state: "running")
        #expect(try ctl(h, ["status"]).status == 0)
    }

    /// Options after the command apply too: `--check` last still fails on a non-zero code.
    @Test func optionsAfterTheCommandApply() throws {
        let h = try TestHost(plugins: [TestHost.echo()])
        #expect(try ctl(h, ["call", "echo.echo", #"{"code":3}"#, "--check"]).status == 65)
        #expect(try ctl(h, ["--check", "call", "echo.echo", #"{"code":3}"#]).status == 65)
        let ok = try ctl(h, ["call", "echo.echo", #"{"code":0}"#, "--check"])
        #expect(ok.status == 0 && ok.out.contains(#""code":0"#))
    }

    /// `pylonctl COMMAND --help` is that command's usage; an unknown option is reported as an
    /// option (it was parsed as JSON params); "-" and a JSON number stay arguments.
    @Test func helpPerCommandAndUnknownOptions() throws {
        let h = try TestHost(plugins: [TestHost.echo()])
        for c in ["call", "monitor", "reload", "wait-ready", "log-level", "status"] {
            let r = try ctl(h, [c, "--help"])
            #expect(r.status == 0 && r.out.hasPrefix("usage: pylonctl [OPTIONS] \(c)"), "\(c): \(r)")
        }
        #expect(try ctl(h, ["help", "monitor"]).out.contains("--verbose"))
        let bad = try ctl(h, ["call", "echo.echo", "--foo"])
        #expect(bad.status == 64 && bad.err.hasPrefix("pylonctl: unknown option --foo"), "\(bad)")
        #expect(!bad.err.contains("JSON"))
        #expect(try ctl(h, ["status", "--nope"]).status == 64)
        #expect(try ctl(h, ["call", "echo.echo", "-"], input: "[-1]").out == "[-1]\n")
    }

    /// `pylonctl monitor` prints an `echo.*` call (request, then reply with "ok") with its caller.
    @Test func monitorCommandPrintsACall() throws {
        let h = try TestHost(plugins: [TestHost.echo()])
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylonctl")
        p.arguments = ["--socket", h.socket, "monitor", "echo.*"]
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        try p.run()
        defer { if p.isRunning { kill(p.processIdentifier, SIGKILL) }; p.waitUntilExit() }
        try waitUntil(timeout: 10) { try h.status()["counters"]?["monitors"] == 1 }
        _ = try h.client().call("echo.echo", ["hello": "monitor"])
        var text = ""
        while text.split(separator: "\n").count < 2 {
            let d = out.fileHandleForReading.availableData
            if d.isEmpty { break }
            text += String(decoding: d, as: UTF8.self)
        }
        let lines = text.split(separator: "\n")
        #expect(lines.count >= 2, "\(text)")
        #expect(lines.first?.contains("request") == true && lines.first?.contains("echo.echo") == true, "\(text)")
        #expect(lines.first?.contains("uid=\(getuid())") == true && lines.first?.contains("-> plugin:echo") == true, "\(text)")
        #expect(lines.dropFirst().first?.contains("reply") == true && lines.dropFirst().first?.hasSuffix(" ok") == true, "\(text)")
    }

    /// A refused configuration: `pylonctl reload` names file:line:col and exits 78; the running
    /// configuration stays. An accepted one reports the plugin added and the setting it could not
    /// apply; `wait-ready` then waits for the new plugin.
    @Test func reloadReportsRefusalsAndWhatItCouldNotApply() throws {
        let h = try TestHost(plugins: [])
        let good = try String(contentsOfFile: h.configPath, encoding: .utf8)
        try "{\n  \"socket\": \"x\",\n  oops\n}\n".write(toFile: h.configPath, atomically: true, encoding: .utf8)
        let refused = try ctl(h, ["reload"])
        #expect(refused.status == 78, "\(refused)")
        #expect(refused.err.contains(h.configPath + ":3:3"), "\(refused.err)")
        #expect(try ctl(h, ["ping"]).status == 0)
        var cfg = try JSON.parse(good).objectValue!
        cfg["plugins"] = [TestHost.echo()]
        cfg["socket"] = .string(h.dir + "/elsewhere.sock")
        try JSON.object(cfg).serialized.write(toFile: h.configPath, atomically: true, encoding: .utf8)
        let ok = try ctl(h, ["reload", "--json"])
        #expect(ok.status == 0, "\(ok)")
        let r = try JSON.parse(ok.out)
        #expect(r["added"] == ["echo"] && r["notApplied"]?.arrayValue?.first?["setting"] == "socket", "\(r)")
        #expect(h.logText.contains("setting not applied"))
        #expect(try ctl(h, ["reload"]).err.contains("not applied: socket"))
        let ready = try ctl(h, ["wait-ready", "--timeout", "20"])
        #expect(ready.status == 0, "\(ready)")
        #expect(try h.plugin("echo")["state"] == "running")
    }

    /// `wait-ready`: 0 once all run, 3 at once for a failed plugin, 75 with what is missing when
    /// the time is up.
    @Test func waitReadyExitStatuses() throws {
        let h = try TestHost(plugins: [TestHost.echo(name: "echo", ["maxRestarts": 0, "intensityWindowMs": 60000])])
        #expect(try ctl(h, ["wait-ready"]).status == 0)
        _ = try? h.client().call("echo.crash", nil, timeoutMs: 2000)
        try h.waitForPlugin(state: "failed")
        let failed = try ctl(h, ["wait-ready", "-t", "30"])
        #expect(failed.status == 3 && failed.err.contains("echo is failed"), "\(failed)")
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylonctl")
        p.arguments = ["--socket", h.dir + "/absent.sock", "wait-ready", "--timeout", "0.3"]
        let err = Pipe()
        p.standardError = err
        try p.run()
        let text = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        #expect(p.terminationStatus == 75 && text.contains("not ready after 0.3 s: cannot connect"), "\(text)")
    }

    /// `log-level`: the host's and a plugin's, admins only (uid 65534 gets 77).
    @Test func logLevelForTheHostAndAPlugin() throws {
        var cfg: JSONObject = [:]
        cfg["socketMode"] = "0666"
        let h = try TestHost(plugins: [TestHost.echo()], extra: cfg)
        let host = try ctl(h, ["log-level", "debug"])
        #expect(host.status == 0 && host.out.contains("\"scope\":\"host\""), "\(host)")
        let plugin = try ctl(h, ["log-level", "warn", "--plugin", "echo"])
        #expect(plugin.status == 0 && plugin.out.contains("\"sent\":true"), "\(plugin)")
        try waitUntil(timeout: 10) { h.logText.contains("log level set by the host") }
        #expect(try ctl(h, ["log-level", "loud"]).status == 1)
        #expect(try ctl(h, ["log-level", "info", "--plugin", "nope"]).status == 1)
        #expect(try ctl(h, ["log-level"]).status == 64)
        #expect(try ctl(h, ["log-level", "debug"], uid: 65534).status == 77)
    }

    /// `pylonctl describe METHOD` prints one method (who serves it, its consent switch, a params
    /// table, the result); an unknown method exits 1 with a message; `--openrpc` prints the
    /// OpenRPC document.
    @Test func describeOneMethodAndOpenRPC() throws {
        let h = try TestHost(plugins: [TestHost.echo()])
        let r = try ctl(h, ["describe", "echo.sleep"])
        #expect(r.status == 0, "\(r)")
        let lines = r.out.split(separator: "\n").map(String.init)
        #expect(lines.first == "echo.sleep  (plugin echo)", "\(r.out)")
        #expect(lines.contains("  consent: none"))
        #expect(lines.contains { $0.hasPrefix("  PARAM") && $0.contains("TYPE") && $0.contains("REQUIRED") })
        #expect(lines.contains { $0.hasPrefix("  ms ") && $0.contains("integer") && $0.contains(" no ") }, "\(r.out)")
        #expect(lines.contains { $0.hasPrefix("  result: object") })
        #expect(lines.contains { $0.hasPrefix("  slept_ms ") && $0.contains("integer") })
        let collect = try ctl(h, ["describe", "echo.collect"])
        #expect(collect.out.contains("consent: echo:{appKey} (refused -32003 when denied)"), "\(collect.out)")
        let host = try ctl(h, ["describe", "consent.set"])
        #expect(host.status == 0 && host.out.hasPrefix("consent.set  (host method, pylond)"), "\(host)")
        #expect(host.out.contains("  granted ") && host.out.contains("boolean"))
        let json = try ctl(h, ["describe", "echo.sleep", "--json"])
        #expect(try JSON.parse(json.out)["plugin"] == "echo", "\(json)")
        let unknown = try ctl(h, ["describe", "echo.nosuch"])
        #expect(unknown.status == 1 && unknown.err.hasPrefix("pylonctl: unknown method echo.nosuch"), "\(unknown)")
        let openrpc = try ctl(h, ["describe", "--openrpc"])
        #expect(openrpc.status == 0, "\(openrpc.err)")
        #expect(try JSON.parse(openrpc.out)["openrpc"] == "1.2.6")
        let both = try ctl(h, ["describe", "echo.sleep", "--openrpc"])
        #expect(both.status == 64)
    }

}
