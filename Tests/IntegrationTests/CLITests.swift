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
}
