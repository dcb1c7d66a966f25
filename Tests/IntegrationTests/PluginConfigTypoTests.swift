import Foundation
import TestSupport
import Testing

/// A typo in a plugin's `config` is an error under `--check-config` (issue 38 item 2): each
/// plugin's own strict reader (the kit's `ConfigReader`) reports the setting it was not asked for,
/// and the plugin exits 78 (EX_CONFIG), so `pylond --check-config` and a reload refuse the file.
/// A correctly spelled setting next to it passes. At start the same typo stays a warning.
@Suite struct PluginConfigTypoTests {
    /// Runs `PLUGIN --check-config` (no bus) with `config` on stdin.
    func check(_ exe: String, _ config: String) throws -> (status: Int32, output: String) {
        try runWithInput(binDir + "/" + exe, ["--check-config"], input: config)
    }

    /// Each plugin: a setting it knows, and the same one misspelt.
    @Test(arguments: [
        ("pylon-ma", #""retryMaxMs": 1000"#, #""retryMaxMS": 1000"#, "config.retryMaxMS: unknown setting"),
        ("pylon-gtm", #""logLevel": "info""#, #""loglevel": "info""#, "config.loglevel: unknown setting"),
        ("pylon-push", #""inboxMaxCount": 10"#, #""inboxMaxCuont": 10"#, "config.inboxMaxCuont: unknown setting"),
        ("pylon-uploader", #""maxDiskBytes": 1048576"#, #""maxDiskBytez": 1048576"#, "config.maxDiskBytez: unknown setting"),
    ])
    func aTypoIsAnError(exe: String, good: String, typo: String, problem: String) throws {
        let ok = try check(exe, "{\(good), \"_comment\": \"comments are not settings\"}")
        #expect(ok.status == 0 && ok.output.contains("config ok"), "\(exe): \(ok.output)")
        let bad = try check(exe, "{\(good), \(typo)}")
        #expect(bad.status == 78, "\(exe): \(bad.output)")
        #expect(bad.output.contains(problem), "\(exe): \(bad.output)")
        #expect(!bad.output.contains("config ok"))
    }
}
