import Foundation
import TestSupport
import Testing

/// `pylonctl` against a real host: exit statuses a script relies on.
@Suite(.serialized) struct CLITests {
    /// Runs pylonctl against `h`; its exit status and standard output.
    func ctl(_ h: TestHost, _ args: [String]) throws -> (status: Int32, out: String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binDir + "/pylonctl")
        p.arguments = ["--socket", h.socket] + args
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        let status = p.terminationReason == .uncaughtSignal ? 128 + p.terminationStatus : p.terminationStatus
        return (status, String(decoding: data, as: UTF8.self))
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
